package wire

import (
	"github.com/tensorcast/tensorcast/fbs/tcproto"
)

// RequestKind names a request body: the schema's RequestBody union tag.
type RequestKind = tcproto.RequestBody

// ResponseKind names a response body: the schema's ResponseBody union tag.
type ResponseKind = tcproto.ResponseBody

// RequestBody is one request message: a pointer to a struct of this package
// named after its schema table. Only this package implements it.
type RequestBody interface {
	// Kind is the body's union tag. It does not read its receiver, so it
	// may be called on a nil pointer.
	Kind() RequestKind
	table
}

// ResponseBody is one response message, as RequestBody is a request.
type ResponseBody interface {
	Kind() ResponseKind
	table
}

// Context travels with every request; the mutating ones are audited with
// RequestID + IdempotencyKey + Lane + PolicyVersion. The byte slices of a
// decoded Context alias the frame.
type Context struct {
	RequestID      uint64
	IdempotencyKey []byte
	Lane           []byte
	PolicyVersion  uint32
	// QoS is carried for the protocol's sake; the daemon does not act on
	// it.
	QoS        uint8
	DeadlineMS uint32
	// Replicas, when not 0, is how many copies (this host's included) the
	// store across hosts keeps of each value a StorePut or StoreCommit of
	// this call stores, instead of the daemon's store_replicas.
	Replicas uint8
}

func (m *Context) fields(f *fields) {
	scalar(f, 0, &m.RequestID)
	optText(f, 1, &m.IdempotencyKey, f.lim.MaxString)
	optText(f, 2, &m.Lane, f.lim.MaxString)
	scalar(f, 3, &m.PolicyVersion)
	scalar(f, 4, &m.QoS)
	scalar(f, 5, &m.DeadlineMS)
	scalar(f, 6, &m.Replicas)
}

// Request is a request frame: its Context and its body. Set Body directly,
// or with SetRequest to reuse one body per kind across calls.
type Request struct {
	Ctx  Context
	Body RequestBody // nil only in a malformed frame

	// spare holds, by kind, the bodies earlier decodes and SetRequest
	// calls made, to be reused; codec is the state of their passes.
	spare []RequestBody
	codec fields
}

func (m *Request) fields(f *fields) {
	nested(f, 0, &m.Ctx)
	body(f, 1, &m.Body, &m.spare, requests)
}

// Kind is the request's body kind (RequestBodyNONE without a body).
func (r *Request) Kind() RequestKind {
	if r.Body == nil {
		return tcproto.RequestBodyNONE
	}
	return r.Body.Kind()
}

// SetRequest makes a zero T r's body and returns it. The T is the one r
// used for its kind before, so a caller that sends the same kinds over and
// over allocates nothing.
func SetRequest[T any, P interface {
	*T
	RequestBody
}](r *Request) P {
	return set[T, P](&r.spare, requests, P(nil).Kind(), &r.Body)
}

// Response is a response frame: the status of the request it answers, a
// short generic message and, when the status is OK, the body.
type Response struct {
	// RequestID is the request this answers (0 when the daemon could not
	// read one: a malformed frame, a refused connection).
	RequestID uint64
	Status    Code
	Message   []byte       // aliases the frame when decoded
	Body      ResponseBody // nil: no body (an error answer)

	spare []ResponseBody // as Request's
	codec fields
}

func (m *Response) fields(f *fields) {
	scalar(f, 0, &m.Status)
	optText(f, 1, &m.Message, f.lim.MaxString)
	body(f, 2, &m.Body, &m.spare, responses)
	scalar(f, 4, &m.RequestID)
}

// Kind is the response's body kind (ResponseBodyNONE without a body).
func (r *Response) Kind() ResponseKind {
	if r.Body == nil {
		return tcproto.ResponseBodyNONE
	}
	return r.Body.Kind()
}

// Reset readies r to answer request id: OK, no message, no body. It keeps
// the bodies r can reuse, which assigning a new Response would drop.
func (r *Response) Reset(id uint64) {
	r.RequestID, r.Status, r.Message, r.Body = id, tcproto.CodeOK, nil, nil
}

// SetResponse makes a zero T r's body and returns it, reusing r's earlier
// T as SetRequest does.
func SetResponse[T any, P interface {
	*T
	ResponseBody
}](r *Response) P {
	return set[T, P](&r.spare, responses, P(nil).Kind(), &r.Body)
}

// reuse returns the spare body of kind k, made by makers[k] on first use;
// false when k is no message this package knows.
func reuse[K ~uint8, B any](spare *[]B, makers []func() B, k K) (b B, ok bool) {
	if int(k) >= len(makers) || makers[k] == nil {
		return b, false
	}
	if *spare == nil {
		*spare = make([]B, len(makers))
	}
	if any((*spare)[k]) == nil {
		(*spare)[k] = makers[k]()
	}
	return (*spare)[k], true
}

// set makes the spare body of kind k, a *T, zero and *body, and returns it.
func set[T any, P interface{ *T }, K ~uint8, B any](spare *[]B, makers []func() B, k K, body *B) P {
	b, _ := reuse(spare, makers, k)
	p := any(b).(P)
	var zero T
	*p = zero
	*body = b
	return p
}
