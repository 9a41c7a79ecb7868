package rdma

import (
	"errors"
	"strconv"
)

// WCStatus is a work completion's status (enum ibv_wc_status). The values
// are fixed by the verbs ABI; verbs_linux_test.go checks them against the
// C header.
type WCStatus uint32

// The ibv_wc_status values.
const (
	WCSuccess WCStatus = iota
	WCLocLenErr
	WCLocQPOpErr
	WCLocEECOpErr
	WCLocProtErr
	WCWRFlushErr
	WCMWBindErr
	WCBadRespErr
	WCLocAccessErr
	WCRemInvReqErr
	WCRemAccessErr
	WCRemOpErr
	WCRetryExcErr
	WCRNRRetryExcErr
	WCLocRDDViolErr
	WCRemInvRdReqErr
	WCRemAbortErr
	WCInvEECNErr
	WCInvEECStateErr
	WCFatalErr
	WCRespTimeoutErr
	WCGeneralErr
	WCTMErr
	WCTMRndvIncomplete
	wcStatusCount
)

// wcStatusNames is indexed by WCStatus: the C enumerator names, so that a
// failed task's error says exactly what the device reported.
var wcStatusNames = [wcStatusCount]string{
	WCSuccess:          "IBV_WC_SUCCESS",
	WCLocLenErr:        "IBV_WC_LOC_LEN_ERR",
	WCLocQPOpErr:       "IBV_WC_LOC_QP_OP_ERR",
	WCLocEECOpErr:      "IBV_WC_LOC_EEC_OP_ERR",
	WCLocProtErr:       "IBV_WC_LOC_PROT_ERR",
	WCWRFlushErr:       "IBV_WC_WR_FLUSH_ERR",
	WCMWBindErr:        "IBV_WC_MW_BIND_ERR",
	WCBadRespErr:       "IBV_WC_BAD_RESP_ERR",
	WCLocAccessErr:     "IBV_WC_LOC_ACCESS_ERR",
	WCRemInvReqErr:     "IBV_WC_REM_INV_REQ_ERR",
	WCRemAccessErr:     "IBV_WC_REM_ACCESS_ERR",
	WCRemOpErr:         "IBV_WC_REM_OP_ERR",
	WCRetryExcErr:      "IBV_WC_RETRY_EXC_ERR",
	WCRNRRetryExcErr:   "IBV_WC_RNR_RETRY_EXC_ERR",
	WCLocRDDViolErr:    "IBV_WC_LOC_RDD_VIOL_ERR",
	WCRemInvRdReqErr:   "IBV_WC_REM_INV_RD_REQ_ERR",
	WCRemAbortErr:      "IBV_WC_REM_ABORT_ERR",
	WCInvEECNErr:       "IBV_WC_INV_EECN_ERR",
	WCInvEECStateErr:   "IBV_WC_INV_EEC_STATE_ERR",
	WCFatalErr:         "IBV_WC_FATAL_ERR",
	WCRespTimeoutErr:   "IBV_WC_RESP_TIMEOUT_ERR",
	WCGeneralErr:       "IBV_WC_GENERAL_ERR",
	WCTMErr:            "IBV_WC_TM_ERR",
	WCTMRndvIncomplete: "IBV_WC_TM_RNDV_INCOMPLETE",
}

// String is the C enumerator name, or "IBV_WC_STATUS(n)" for a value this
// table does not know (a newer provider may report one).
func (s WCStatus) String() string {
	if s < wcStatusCount {
		return wcStatusNames[s]
	}
	return "IBV_WC_STATUS(" + strconv.FormatUint(uint64(s), 10) + ")"
}

// CompletionError is how a task ends when one of its work requests completed
// with an error status. It matches ErrCompletion with errors.Is.
type CompletionError struct {
	Status    WCStatus
	VendorErr uint32
	// QP is the index of the queue pair in its transport.
	QP int
}

func (e *CompletionError) Error() string {
	return "rdma: work completion error: " + e.Status.String() +
		" (vendor error " + strconv.FormatUint(uint64(e.VendorErr), 10) +
		", qp " + strconv.Itoa(e.QP) + ")"
}

// Is makes errors.Is(err, ErrCompletion) true, and so errors.Is with
// ErrCompletion's category.
func (e *CompletionError) Is(target error) bool {
	return target == ErrCompletion || errors.Is(ErrCompletion, target)
}

// completionErrors holds one preallocated error per (qp, status) so that the
// completion path allocates nothing when it fails tasks.
type completionErrors struct {
	byStatus [wcStatusCount]*CompletionError
	qp       int
}

func newCompletionErrors(qp int) *completionErrors {
	c := &completionErrors{qp: qp}
	for i := range c.byStatus {
		c.byStatus[i] = &CompletionError{Status: WCStatus(i), QP: qp}
	}
	return c
}

// get returns the error for status s with vendor error v. Known statuses
// without a vendor code come from the table; anything else is allocated
// (rare: error completions end a connection's life anyway).
func (c *completionErrors) get(s WCStatus, v uint32) error {
	if s < wcStatusCount && v == 0 {
		return c.byStatus[s]
	}
	return &CompletionError{Status: s, VendorErr: v, QP: c.qp}
}
