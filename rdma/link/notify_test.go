package link

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/tensorcast/tensorcast/tcp"
	"github.com/tensorcast/tensorcast/xfer"
)

func TestParseNotify(t *testing.T) {
	name, payload, err := parseNotify(notifyReq("kv", []byte("ready")))
	if err != nil || name != "kv" || string(payload) != "ready" {
		t.Fatalf("round trip: %q %q %v", name, payload, err)
	}
	if name, payload, err := parseNotify(notifyReq(strings.Repeat("n", 255), nil)); err != nil || len(name) != 255 || len(payload) != 0 {
		t.Fatalf("a 255-byte name and no payload: %d %d %v", len(name), len(payload), err)
	}
	for _, bad := range [][]byte{nil, {}, {3, 'k', 'v'}, append([]byte{2, 'k', 'v'}, make([]byte, tcp.MaxNotify+1)...)} {
		if _, _, err := parseNotify(bad); !errors.Is(err, xfer.ErrInvalid) {
			t.Errorf("parseNotify(%d bytes) = %v, want ErrInvalid", len(bad), err)
		}
	}
}

// FuzzNotifyRequest: whatever a peer sends as a notification exchange,
// parsing it never panics, and what it accepts is a name and a bounded
// payload that encode back to the same bytes.
func FuzzNotifyRequest(f *testing.F) {
	f.Add(notifyReq("kv", []byte("ready")))
	f.Add([]byte{0})
	f.Add([]byte{5, 'a'})
	f.Fuzz(func(t *testing.T, req []byte) {
		name, payload, err := parseNotify(req)
		if err != nil {
			if !errors.Is(err, xfer.ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		if len(payload) > tcp.MaxNotify || len(name) > 255 {
			t.Fatalf("accepted a %d-byte name and a %d-byte payload", len(name), len(payload))
		}
		if !bytes.Equal(notifyReq(name, payload), req) {
			t.Fatal("what was accepted does not encode back to the request")
		}
	})
}
