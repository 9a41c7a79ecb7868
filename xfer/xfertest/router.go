package xfertest

import "github.com/tensorcast/tensorcast/xfer"

// RouterFunc is an xfer.Router made of a function.
type RouterFunc func(local, target xfer.Segment) (xfer.Transport, error)

var _ xfer.Router = RouterFunc(nil)

// Route calls f.
func (f RouterFunc) Route(local, target xfer.Segment) (xfer.Transport, error) {
	return f(local, target)
}

// RouteAll routes every request to tr.
func RouteAll(tr xfer.Transport) RouterFunc {
	return func(_, _ xfer.Segment) (xfer.Transport, error) { return tr, nil }
}

// RefuseAll refuses every request with err.
func RefuseAll(err error) RouterFunc {
	return func(_, _ xfer.Segment) (xfer.Transport, error) { return nil, err }
}
