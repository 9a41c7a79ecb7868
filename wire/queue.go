package wire

import "github.com/tensorcast/tensorcast/fbs/tcproto"

// OpenQueueRequest opens a shared-memory queue pair between the connection
// and the daemon. The decoder passes the sizes through as they are; the
// daemon checks them and may round them up.
type OpenQueueRequest struct {
	SQEntries uint32 // submission ring entries
	CQEntries uint32 // completion ring entries; 0 means 2x SQEntries
	DataSize  uint32 // bytes of the data area for keys and notification payloads; 0 means a default
}

func (*OpenQueueRequest) Kind() RequestKind { return tcproto.RequestBodyOpenQueueRequest }

func (m *OpenQueueRequest) fields(f *fields) {
	scalar(f, 0, &m.SQEntries)
	scalar(f, 1, &m.CQEntries)
	scalar(f, 2, &m.DataSize)
}

// OpenQueueResponse describes the queue the daemon made; its memfd travels
// with the response (SCM_RIGHTS).
type OpenQueueResponse struct {
	Queue     uint64 // the queue's id, for CloseQueue
	SQEntries uint32 // as made, after rounding
	CQEntries uint32
	DataSize  uint32
	Size      uint64 // the whole mapping's length in bytes
}

func (*OpenQueueResponse) Kind() ResponseKind { return tcproto.ResponseBodyOpenQueueResponse }

func (m *OpenQueueResponse) fields(f *fields) {
	scalar(f, 0, &m.Queue)
	scalar(f, 1, &m.SQEntries)
	scalar(f, 2, &m.CQEntries)
	scalar(f, 3, &m.DataSize)
	scalar(f, 4, &m.Size)
}

// CloseQueueRequest closes a queue the connection opened; what is in flight
// on it ends.
type CloseQueueRequest struct{ Queue uint64 }

func (*CloseQueueRequest) Kind() RequestKind { return tcproto.RequestBodyCloseQueueRequest }

func (m *CloseQueueRequest) fields(f *fields) { scalar(f, 0, &m.Queue) }

// CloseQueueResponse says the queue is closed.
type CloseQueueResponse struct{ noFields }

func (*CloseQueueResponse) Kind() ResponseKind { return tcproto.ResponseBodyCloseQueueResponse }
