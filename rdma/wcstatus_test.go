package rdma

import (
	"errors"
	"strings"
	"testing"
)

func TestWCStatusNames(t *testing.T) {
	for s := WCStatus(0); s < wcStatusCount; s++ {
		name := s.String()
		if !strings.HasPrefix(name, "IBV_WC_") || strings.Contains(name, "(") {
			t.Errorf("status %d has name %q", s, name)
		}
	}
	for s, want := range map[WCStatus]string{
		0: "IBV_WC_SUCCESS", 5: "IBV_WC_WR_FLUSH_ERR", 10: "IBV_WC_REM_ACCESS_ERR",
		12: "IBV_WC_RETRY_EXC_ERR", 13: "IBV_WC_RNR_RETRY_EXC_ERR", 20: "IBV_WC_RESP_TIMEOUT_ERR",
		23: "IBV_WC_TM_RNDV_INCOMPLETE", 24: "IBV_WC_STATUS(24)", 1000: "IBV_WC_STATUS(1000)",
	} {
		if got := s.String(); got != want {
			t.Errorf("WCStatus(%d) = %q, want %q", s, got, want)
		}
	}
}

func TestCompletionErrors(t *testing.T) {
	c := newCompletionErrors(3)
	err := c.get(WCRemAccessErr, 0)
	if err != c.get(WCRemAccessErr, 0) {
		t.Error("the same status does not reuse its preallocated error")
	}
	var ce *CompletionError
	if !errors.Is(err, ErrCompletion) || !errors.As(err, &ce) || ce.Status != WCRemAccessErr || ce.QP != 3 {
		t.Fatalf("err = %#v", err)
	}
	if !strings.Contains(err.Error(), "IBV_WC_REM_ACCESS_ERR") || !strings.Contains(err.Error(), "qp 3") {
		t.Errorf("message %q lacks the status name or the queue pair", err)
	}
	v := c.get(WCGeneralErr, 0x42)
	if !errors.As(v, &ce) || ce.VendorErr != 0x42 || !strings.Contains(v.Error(), "vendor error 66") {
		t.Errorf("vendor error: %v", v)
	}
	if u := c.get(99, 0); !strings.Contains(u.Error(), "IBV_WC_STATUS(99)") {
		t.Errorf("unknown status: %v", u)
	}
}
