package status_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/tensorcast/tensorcast/bench"
	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/control"
	"github.com/tensorcast/tensorcast/daemon"
	"github.com/tensorcast/tensorcast/daemon/config"
	"github.com/tensorcast/tensorcast/directory"
	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/ktrace"
	"github.com/tensorcast/tensorcast/peer"
	"github.com/tensorcast/tensorcast/peer/plane"
	"github.com/tensorcast/tensorcast/queue"
	"github.com/tensorcast/tensorcast/rdma"
	"github.com/tensorcast/tensorcast/reactor"
	"github.com/tensorcast/tensorcast/session"
	"github.com/tensorcast/tensorcast/shm"
	"github.com/tensorcast/tensorcast/status"
	"github.com/tensorcast/tensorcast/store"
	"github.com/tensorcast/tensorcast/store/cluster"
	"github.com/tensorcast/tensorcast/store/cluster/grant"
	"github.com/tensorcast/tensorcast/tcp"
	"github.com/tensorcast/tensorcast/uring"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// everyError is every exported error of every package, by the name
// exportedErrors gives it, with the code a client sees for it. A package
// that adds an error adds it here (TestEveryErrorMapped fails until it
// does), in the category its doc comment names.
var everyError = map[string]struct {
	err  error
	want wire.Code
}{
	// xfer
	"xfer.ErrAlreadyExists": {xfer.ErrAlreadyExists, tcproto.CodeALREADY_EXISTS},
	"xfer.ErrBackpressure":  {xfer.ErrBackpressure, tcproto.CodeRESOURCE_EXHAUSTED},
	"xfer.ErrBadOp":         {xfer.ErrBadOp, tcproto.CodeINVALID_ARGUMENT},
	"xfer.ErrBatchBusy":     {xfer.ErrBatchBusy, tcproto.CodeBUSY},
	"xfer.ErrBatchFull":     {xfer.ErrBatchFull, tcproto.CodeRESOURCE_EXHAUSTED},
	"xfer.ErrBatchLimit":    {xfer.ErrBatchLimit, tcproto.CodeRESOURCE_EXHAUSTED},
	"xfer.ErrBatchNotFound": {xfer.ErrBatchNotFound, tcproto.CodeNOT_FOUND},
	"xfer.ErrBusy":          {xfer.ErrBusy, tcproto.CodeBUSY},
	"xfer.ErrCanceled":      {xfer.ErrCanceled, tcproto.CodeUNAVAILABLE},
	"xfer.ErrClosed":        {xfer.ErrClosed, tcproto.CodeUNAVAILABLE},
	"xfer.ErrExists":        {xfer.ErrExists, tcproto.CodeALREADY_EXISTS},
	"xfer.ErrFault":         {xfer.ErrFault, tcproto.CodeFAILED_PRECONDITION},
	"xfer.ErrUnsealed":      {xfer.ErrUnsealed, tcproto.CodeFAILED_PRECONDITION},
	"xfer.ErrInvalid":       {xfer.ErrInvalid, tcproto.CodeINVALID_ARGUMENT},
	"xfer.ErrNoNotify":      {xfer.ErrNoNotify, tcproto.CodeUNAVAILABLE},
	"xfer.ErrNoSegment":     {xfer.ErrNoSegment, tcproto.CodeNOT_FOUND},
	"xfer.ErrNotFound":      {xfer.ErrNotFound, tcproto.CodeNOT_FOUND},
	"xfer.ErrNotSupported":  {xfer.ErrNotSupported, tcproto.CodeUNAVAILABLE},
	"xfer.ErrOutOfBounds":   {xfer.ErrOutOfBounds, tcproto.CodeINVALID_ARGUMENT},
	"xfer.ErrPermission":    {xfer.ErrPermission, tcproto.CodePERMISSION_DENIED},
	"xfer.ErrPrecondition":  {xfer.ErrPrecondition, tcproto.CodeFAILED_PRECONDITION},
	"xfer.ErrRangeRefused":  {xfer.ErrRangeRefused, tcproto.CodePERMISSION_DENIED},
	"xfer.ErrTimeout":       {xfer.ErrTimeout, tcproto.CodeDEADLINE_EXCEEDED},
	"xfer.ErrTransport":     {xfer.ErrTransport, tcproto.CodeINTERNAL},
	"xfer.ErrUnavailable":   {xfer.ErrUnavailable, tcproto.CodeUNAVAILABLE},
	"xfer.ErrZeroLength":    {xfer.ErrZeroLength, tcproto.CodeINVALID_ARGUMENT},
	// xfer/xfertest
	"xfer/xfertest.ErrInjected": {xfertest.ErrInjected, tcproto.CodeINTERNAL},
	// wire
	"wire.ErrLimit":     {wire.ErrLimit, tcproto.CodeRESOURCE_EXHAUSTED},
	"wire.ErrMalformed": {wire.ErrMalformed, tcproto.CodeINVALID_ARGUMENT},
	// queue
	"queue.ErrBroken":       {queue.ErrBroken, tcproto.CodeFAILED_PRECONDITION},
	"queue.ErrClosed":       {queue.ErrClosed, tcproto.CodeUNAVAILABLE},
	"queue.ErrDataFull":     {queue.ErrDataFull, tcproto.CodeRESOURCE_EXHAUSTED},
	"queue.ErrGeometry":     {queue.ErrGeometry, tcproto.CodeINVALID_ARGUMENT},
	"queue.ErrNotSupported": {queue.ErrNotSupported, tcproto.CodeUNAVAILABLE},
	"queue.ErrTimeout":      {queue.ErrTimeout, tcproto.CodeDEADLINE_EXCEEDED},
	// reactor
	"reactor.ErrConfig":  {reactor.ErrConfig, tcproto.CodeINVALID_ARGUMENT},
	"reactor.ErrStopped": {reactor.ErrStopped, tcproto.CodeUNAVAILABLE},
	// shm
	"shm.ErrBadFree":       {shm.ErrBadFree, tcproto.CodeNOT_FOUND},
	"shm.ErrClosed":        {shm.ErrClosed, tcproto.CodeUNAVAILABLE},
	"shm.ErrInvalidConfig": {shm.ErrInvalidConfig, tcproto.CodeINVALID_ARGUMENT},
	"shm.ErrInvalidID":     {shm.ErrInvalidID, tcproto.CodeINVALID_ARGUMENT},
	"shm.ErrInvalidSize":   {shm.ErrInvalidSize, tcproto.CodeINVALID_ARGUMENT},
	"shm.ErrNoHugepages":   {shm.ErrNoHugepages, tcproto.CodeUNAVAILABLE},
	"shm.ErrNotMappable":   {shm.ErrNotMappable, tcproto.CodeINVALID_ARGUMENT},
	"shm.ErrNotSupported":  {shm.ErrNotSupported, tcproto.CodeUNAVAILABLE},
	"shm.ErrPoolExhausted": {shm.ErrPoolExhausted, tcproto.CodeRESOURCE_EXHAUSTED},
	"shm.ErrShortFile":     {shm.ErrShortFile, tcproto.CodeINVALID_ARGUMENT},
	"shm.ErrTooLarge":      {shm.ErrTooLarge, tcproto.CodeRESOURCE_EXHAUSTED},
	// uring
	"uring.ErrBadRequest":        {uring.ErrBadRequest, tcproto.CodeINVALID_ARGUMENT},
	"uring.ErrConfig":            {uring.ErrConfig, tcproto.CodeINVALID_ARGUMENT},
	"uring.ErrDirectUnsupported": {uring.ErrDirectUnsupported, tcproto.CodeUNAVAILABLE},
	"uring.ErrMisaligned":        {uring.ErrMisaligned, tcproto.CodeINVALID_ARGUMENT},
	"uring.ErrNotAllowed":        {uring.ErrNotAllowed, tcproto.CodePERMISSION_DENIED},
	"uring.ErrNotSupported":      {uring.ErrNotSupported, tcproto.CodeUNAVAILABLE},
	"uring.ErrQueueFull":         {uring.ErrQueueFull, tcproto.CodeRESOURCE_EXHAUSTED},
	"uring.ErrRingFailed":        {uring.ErrRingFailed, tcproto.CodeUNAVAILABLE},
	"uring.ErrShortIO":           {uring.ErrShortIO, tcproto.CodeFAILED_PRECONDITION},
	// tcp
	"tcp.ErrAuth":           {tcp.ErrAuth, tcproto.CodeUNAVAILABLE},
	"tcp.ErrBacklog":        {tcp.ErrBacklog, tcproto.CodeRESOURCE_EXHAUSTED},
	"tcp.ErrConfig":         {tcp.ErrConfig, tcproto.CodeINVALID_ARGUMENT},
	"tcp.ErrConnLost":       {tcp.ErrConnLost, tcproto.CodeUNAVAILABLE},
	"tcp.ErrExchange":       {tcp.ErrExchange, tcproto.CodeUNAVAILABLE},
	"tcp.ErrPeerBusy":       {tcp.ErrPeerBusy, tcproto.CodeUNAVAILABLE},
	"tcp.ErrFrame":          {tcp.ErrFrame, tcproto.CodeUNAVAILABLE},
	"tcp.ErrKeyFile":        {tcp.ErrKeyFile, tcproto.CodeINVALID_ARGUMENT},
	"tcp.ErrNoHandler":      {tcp.ErrNoHandler, tcproto.CodeUNAVAILABLE},
	"tcp.ErrNotFound":       {tcp.ErrNotFound, tcproto.CodeNOT_FOUND},
	"tcp.ErrNotifyRejected": {tcp.ErrNotifyRejected, tcproto.CodeFAILED_PRECONDITION},
	"tcp.ErrProtocol":       {tcp.ErrProtocol, tcproto.CodeUNAVAILABLE},
	"tcp.ErrRefused":        {tcp.ErrRefused, tcproto.CodeUNAVAILABLE},
	"tcp.ErrStaleEpoch":     {tcp.ErrStaleEpoch, tcproto.CodeUNAVAILABLE},
	"tcp.ErrUnknownPeer":    {tcp.ErrUnknownPeer, tcproto.CodeNOT_FOUND},
	"tcp.ErrWindowFull":     {tcp.ErrWindowFull, tcproto.CodeRESOURCE_EXHAUSTED},
	// rdma
	"rdma.ErrCompletion":    {rdma.ErrCompletion, tcproto.CodeUNAVAILABLE},
	"rdma.ErrConnInfo":      {rdma.ErrConnInfo, tcproto.CodeUNAVAILABLE},
	"rdma.ErrConnect":       {rdma.ErrConnect, tcproto.CodeUNAVAILABLE},
	"rdma.ErrNoDevice":      {rdma.ErrNoDevice, tcproto.CodeUNAVAILABLE},
	"rdma.ErrNoGID":         {rdma.ErrNoGID, tcproto.CodeUNAVAILABLE},
	"rdma.ErrNoLibrary":     {rdma.ErrNoLibrary, tcproto.CodeUNAVAILABLE},
	"rdma.ErrNotRegistered": {rdma.ErrNotRegistered, tcproto.CodeFAILED_PRECONDITION},
	"rdma.ErrQPDown":        {rdma.ErrQPDown, tcproto.CodeUNAVAILABLE},
	"rdma.ErrQueueFull":     {rdma.ErrQueueFull, tcproto.CodeRESOURCE_EXHAUSTED},
	// peer
	"peer.ErrDenied":      {peer.ErrDenied, tcproto.CodePERMISSION_DENIED},
	"peer.ErrInvalid":     {peer.ErrInvalid, tcproto.CodeINVALID_ARGUMENT},
	"peer.ErrLimit":       {peer.ErrLimit, tcproto.CodeRESOURCE_EXHAUSTED},
	"peer.ErrNotFound":    {peer.ErrNotFound, tcproto.CodeNOT_FOUND},
	"peer.ErrUnavailable": {peer.ErrUnavailable, tcproto.CodeUNAVAILABLE},
	// peer/plane
	"peer/plane.ErrRDMARequired": {plane.ErrRDMARequired, tcproto.CodeUNAVAILABLE},
	// directory
	"directory.ErrClosed":      {directory.ErrClosed, tcproto.CodeUNAVAILABLE},
	"directory.ErrConfig":      {directory.ErrConfig, tcproto.CodeINVALID_ARGUMENT},
	"directory.ErrIDInUse":     {directory.ErrIDInUse, tcproto.CodeALREADY_EXISTS},
	"directory.ErrInvalid":     {directory.ErrInvalid, tcproto.CodeINVALID_ARGUMENT},
	"directory.ErrNotFound":    {directory.ErrNotFound, tcproto.CodeNOT_FOUND},
	"directory.ErrSelf":        {directory.ErrSelf, tcproto.CodeFAILED_PRECONDITION},
	"directory.ErrUnavailable": {directory.ErrUnavailable, tcproto.CodeUNAVAILABLE},
	// store
	"store.ErrBadCall":      {store.ErrBadCall, tcproto.CodeINVALID_ARGUMENT},
	"store.ErrBadKey":       {store.ErrBadKey, tcproto.CodeINVALID_ARGUMENT},
	"store.ErrBadSize":      {store.ErrBadSize, tcproto.CodeINVALID_ARGUMENT},
	"store.ErrBusy":         {store.ErrBusy, tcproto.CodeBUSY},
	"store.ErrClosed":       {store.ErrClosed, tcproto.CodeUNAVAILABLE},
	"store.ErrConfig":       {store.ErrConfig, tcproto.CodeINVALID_ARGUMENT},
	"store.ErrCorrupt":      {store.ErrCorrupt, tcproto.CodeNOT_FOUND},
	"store.ErrExists":       {store.ErrExists, tcproto.CodeALREADY_EXISTS},
	"store.ErrFault":        {store.ErrFault, tcproto.CodeFAILED_PRECONDITION},
	"store.ErrL1Full":       {store.ErrL1Full, tcproto.CodeRESOURCE_EXHAUSTED},
	"store.ErrL2Format":     {store.ErrL2Format, tcproto.CodeFAILED_PRECONDITION},
	"store.ErrL2Full":       {store.ErrL2Full, tcproto.CodeRESOURCE_EXHAUSTED},
	"store.ErrNoL2":         {store.ErrNoL2, tcproto.CodeFAILED_PRECONDITION},
	"store.ErrNotApplied":   {store.ErrNotApplied, tcproto.CodeFAILED_PRECONDITION},
	"store.ErrNotFound":     {store.ErrNotFound, tcproto.CodeNOT_FOUND},
	"store.ErrNotReserved":  {store.ErrNotReserved, tcproto.CodeFAILED_PRECONDITION},
	"store.ErrOverflow":     {store.ErrOverflow, tcproto.CodeRESOURCE_EXHAUSTED},
	"store.ErrPinLimit":     {store.ErrPinLimit, tcproto.CodeRESOURCE_EXHAUSTED},
	"store.ErrPinned":       {store.ErrPinned, tcproto.CodeFAILED_PRECONDITION},
	"store.ErrReserveLimit": {store.ErrReserveLimit, tcproto.CodeRESOURCE_EXHAUSTED},
	"store.ErrShortBuffer":  {store.ErrShortBuffer, tcproto.CodeINVALID_ARGUMENT},
	"store.ErrTransport":    {store.ErrTransport, tcproto.CodeINTERNAL},
	"store.ErrUnderflow":    {store.ErrUnderflow, tcproto.CodeFAILED_PRECONDITION},
	// store/cluster/grant
	"store/cluster/grant.ErrBusy":           {grant.ErrBusy, tcproto.CodeBUSY},
	"store/cluster/grant.ErrClaimNotFound":  {grant.ErrClaimNotFound, tcproto.CodeNOT_FOUND},
	"store/cluster/grant.ErrNotClaimHolder": {grant.ErrNotClaimHolder, tcproto.CodePERMISSION_DENIED},
	"store/cluster/grant.ErrClosed":         {grant.ErrClosed, tcproto.CodeUNAVAILABLE},
	"store/cluster/grant.ErrExpired":        {grant.ErrExpired, tcproto.CodePERMISSION_DENIED},
	"store/cluster/grant.ErrForeignEpoch":   {grant.ErrForeignEpoch, tcproto.CodePERMISSION_DENIED},
	"store/cluster/grant.ErrForged":         {grant.ErrForged, tcproto.CodePERMISSION_DENIED},
	"store/cluster/grant.ErrHandleLimit":    {grant.ErrHandleLimit, tcproto.CodeRESOURCE_EXHAUSTED},
	"store/cluster/grant.ErrInvalid":        {grant.ErrInvalid, tcproto.CodeINVALID_ARGUMENT},
	"store/cluster/grant.ErrKeysMismatch":   {grant.ErrKeysMismatch, tcproto.CodePERMISSION_DENIED},
	"store/cluster/grant.ErrLeaseConflict":  {grant.ErrLeaseConflict, tcproto.CodeFAILED_PRECONDITION},
	"store/cluster/grant.ErrLeaseEnded":     {grant.ErrLeaseEnded, tcproto.CodeFAILED_PRECONDITION},
	"store/cluster/grant.ErrLeaseLimit":     {grant.ErrLeaseLimit, tcproto.CodeRESOURCE_EXHAUSTED},
	"store/cluster/grant.ErrLeaseNotFound":  {grant.ErrLeaseNotFound, tcproto.CodeNOT_FOUND},
	"store/cluster/grant.ErrNotIssuer":      {grant.ErrNotIssuer, tcproto.CodeFAILED_PRECONDITION},
	"store/cluster/grant.ErrOverBudget":     {grant.ErrOverBudget, tcproto.CodeRESOURCE_EXHAUSTED},
	"store/cluster/grant.ErrPinLimit":       {grant.ErrPinLimit, tcproto.CodeRESOURCE_EXHAUSTED},
	"store/cluster/grant.ErrTooManyKeys":    {grant.ErrTooManyKeys, tcproto.CodeRESOURCE_EXHAUSTED},
	"store/cluster/grant.ErrUnknownIssuer":  {grant.ErrUnknownIssuer, tcproto.CodePERMISSION_DENIED},
	// store/cluster
	"store/cluster.ErrBusy":            {cluster.ErrBusy, tcproto.CodeRESOURCE_EXHAUSTED},
	"store/cluster.ErrClosed":          {cluster.ErrClosed, tcproto.CodeUNAVAILABLE},
	"store/cluster.ErrHolderFailed":    {cluster.ErrHolderFailed, tcproto.CodeUNAVAILABLE},
	"store/cluster.ErrHomeUnreachable": {cluster.ErrHomeUnreachable, tcproto.CodeUNAVAILABLE},
	"store/cluster.ErrCopyKept":        {cluster.ErrCopyKept, tcproto.CodeUNAVAILABLE},
	"store/cluster.ErrMessage":         {cluster.ErrMessage, tcproto.CodeINVALID_ARGUMENT},
	"store/cluster.ErrNotHome":         {cluster.ErrNotHome, tcproto.CodeUNAVAILABLE},
	"store/cluster.ErrReplicaFailed":   {cluster.ErrReplicaFailed, tcproto.CodeUNAVAILABLE},
	"store/cluster.ErrReplicas":        {cluster.ErrReplicas, tcproto.CodeUNAVAILABLE},
	"store/cluster.ErrStaleGeneration": {cluster.ErrStaleGeneration, tcproto.CodeUNAVAILABLE},
	// control
	"control.ErrAddrInUse":           {control.ErrAddrInUse, tcproto.CodeALREADY_EXISTS},
	"control.ErrClosed":              {control.ErrClosed, tcproto.CodeUNAVAILABLE},
	"control.ErrConfig":              {control.ErrConfig, tcproto.CodeINVALID_ARGUMENT},
	"control.ErrFrameTooLarge":       {control.ErrFrameTooLarge, tcproto.CodeRESOURCE_EXHAUSTED},
	"control.ErrIdempotencyConflict": {control.ErrIdempotencyConflict, tcproto.CodeFAILED_PRECONDITION},
	"control.ErrLimit":               {control.ErrLimit, tcproto.CodeRESOURCE_EXHAUSTED},
	"control.ErrMalformed":           {control.ErrMalformed, tcproto.CodeINVALID_ARGUMENT},
	"control.ErrMissingFD":           {control.ErrMissingFD, tcproto.CodeINVALID_ARGUMENT},
	"control.ErrNotFound":            {control.ErrNotFound, tcproto.CodeNOT_FOUND},
	"control.ErrPermission":          {control.ErrPermission, tcproto.CodePERMISSION_DENIED},
	"control.ErrTooManyConns":        {control.ErrTooManyConns, tcproto.CodeRESOURCE_EXHAUSTED},
	"control.ErrUnavailable":         {control.ErrUnavailable, tcproto.CodeUNAVAILABLE},
	"control.ErrUnexpectedFD":        {control.ErrUnexpectedFD, tcproto.CodeINVALID_ARGUMENT},
	// session
	"session.ErrBatchBusy":     {session.ErrBatchBusy, tcproto.CodeBUSY},
	"session.ErrBatchFull":     {session.ErrBatchFull, tcproto.CodeRESOURCE_EXHAUSTED},
	"session.ErrBatchNotFound": {session.ErrBatchNotFound, tcproto.CodeNOT_FOUND},
	"session.ErrClosed":        {session.ErrClosed, tcproto.CodeUNAVAILABLE},
	"session.ErrLimit":         {session.ErrLimit, tcproto.CodeRESOURCE_EXHAUSTED},
	"session.ErrMalformed":     {session.ErrMalformed, tcproto.CodeINVALID_ARGUMENT},
	"session.ErrNotFound":      {session.ErrNotFound, tcproto.CodeNOT_FOUND},
	"session.ErrPermission":    {session.ErrPermission, tcproto.CodePERMISSION_DENIED},
	"session.ErrUnavailable":   {session.ErrUnavailable, tcproto.CodeUNAVAILABLE},
	// daemon
	"daemon.ErrConfig":          {daemon.ErrConfig, tcproto.CodeINVALID_ARGUMENT},
	"daemon.ErrShutdownTimeout": {daemon.ErrShutdownTimeout, tcproto.CodeDEADLINE_EXCEEDED},
	"daemon/config.ErrConfig":   {config.ErrConfig, tcproto.CodeINVALID_ARGUMENT},
	// ktrace
	"ktrace.ErrNoCapability": {ktrace.ErrNoCapability, tcproto.CodePERMISSION_DENIED},
	"ktrace.ErrNoHook":       {ktrace.ErrNoHook, tcproto.CodeUNAVAILABLE},
	"ktrace.ErrNotSupported": {ktrace.ErrNotSupported, tcproto.CodeUNAVAILABLE},
	// client
	"client.ErrAlreadyExists":      {client.ErrAlreadyExists, tcproto.CodeALREADY_EXISTS},
	"client.ErrBusy":               {client.ErrBusy, tcproto.CodeBUSY},
	"client.ErrClosed":             {client.ErrClosed, tcproto.CodeUNAVAILABLE},
	"client.ErrDeadlineExceeded":   {client.ErrDeadlineExceeded, tcproto.CodeDEADLINE_EXCEEDED},
	"client.ErrFailedPrecondition": {client.ErrFailedPrecondition, tcproto.CodeFAILED_PRECONDITION},
	"client.ErrInternal":           {client.ErrInternal, tcproto.CodeINTERNAL},
	"client.ErrInvalidArgument":    {client.ErrInvalidArgument, tcproto.CodeINVALID_ARGUMENT},
	"client.ErrNoPool":             {client.ErrNoPool, tcproto.CodeFAILED_PRECONDITION},
	"client.ErrNotFound":           {client.ErrNotFound, tcproto.CodeNOT_FOUND},
	"client.ErrNotSupported":       {client.ErrNotSupported, tcproto.CodeUNAVAILABLE},
	"client.ErrPermissionDenied":   {client.ErrPermissionDenied, tcproto.CodePERMISSION_DENIED},
	"client.ErrProtocol":           {client.ErrProtocol, tcproto.CodeUNAVAILABLE},
	"client.ErrResourceExhausted":  {client.ErrResourceExhausted, tcproto.CodeRESOURCE_EXHAUSTED},
	"client.ErrUnavailable":        {client.ErrUnavailable, tcproto.CodeUNAVAILABLE},
	// bench
	"bench.ErrBadValue":          {bench.ErrBadValue, tcproto.CodeINTERNAL},
	"bench.ErrDaemon":            {bench.ErrDaemon, tcproto.CodeINTERNAL},
	"bench.ErrDuplicateJob":      {bench.ErrDuplicateJob, tcproto.CodeINTERNAL},
	"bench.ErrEngineUnavailable": {bench.ErrEngineUnavailable, tcproto.CodeINTERNAL},
	"bench.ErrIO":                {bench.ErrIO, tcproto.CodeINTERNAL},
	"bench.ErrMissingOption":     {bench.ErrMissingOption, tcproto.CodeINTERNAL},
	"bench.ErrNoJobs":            {bench.ErrNoJobs, tcproto.CodeINTERNAL},
	"bench.ErrNoTarget":          {bench.ErrNoTarget, tcproto.CodeINTERNAL},
	"bench.ErrSyntax":            {bench.ErrSyntax, tcproto.CodeINTERNAL},
	"bench.ErrToolMissing":       {bench.ErrToolMissing, tcproto.CodeINTERNAL},
	"bench.ErrToolOutput":        {bench.ErrToolOutput, tcproto.CodeINTERNAL},
	"bench.ErrUnknownOption":     {bench.ErrUnknownOption, tcproto.CodeINTERNAL},
	"bench.ErrVerify":            {bench.ErrVerify, tcproto.CodeINTERNAL},
}

// internalAllowed are the errors of everyError that map to INTERNAL, each
// with its reason, which starts with its kind: a known bug, an error of
// start-up only, or one that no daemon answers a client with. Any other
// error that can reach a client is in a category.
var internalAllowed = map[string]string{
	"xfer.ErrTransport":          "bug: a transport broke the Transport contract",
	"store.ErrTransport":         "bug: the L2 transport broke the Transport contract",
	"xfer/xfertest.ErrInjected":  "not the daemon's: a test double's failure, standing for an error nobody foresaw",
	"client.ErrInternal":         "not the daemon's: the client's sentinel of the INTERNAL code",
	"bench.ErrBadValue":          "not the daemon's: tcbench prints its errors and exits",
	"bench.ErrDaemon":            "not the daemon's: tcbench prints its errors and exits",
	"bench.ErrDuplicateJob":      "not the daemon's: tcbench prints its errors and exits",
	"bench.ErrEngineUnavailable": "not the daemon's: tcbench prints its errors and exits",
	"bench.ErrIO":                "not the daemon's: tcbench prints its errors and exits",
	"bench.ErrMissingOption":     "not the daemon's: tcbench prints its errors and exits",
	"bench.ErrNoJobs":            "not the daemon's: tcbench prints its errors and exits",
	"bench.ErrNoTarget":          "not the daemon's: tcbench prints its errors and exits",
	"bench.ErrSyntax":            "not the daemon's: tcbench prints its errors and exits",
	"bench.ErrToolMissing":       "not the daemon's: tcbench prints its errors and exits",
	"bench.ErrToolOutput":        "not the daemon's: tcbench prints its errors and exits",
	"bench.ErrUnknownOption":     "not the daemon's: tcbench prints its errors and exits",
	"bench.ErrVerify":            "not the daemon's: tcbench prints its errors and exits",
}

// The kinds a reason in internalAllowed starts with.
var internalKinds = []string{"bug: ", "start-up: ", "not the daemon's: "}

// TestEveryErrorMapped walks every exported error of every package in the
// module's source: each is in everyError, maps to its code there (bare and
// wrapped), and maps to INTERNAL only with a reason in internalAllowed.
func TestEveryErrorMapped(t *testing.T) {
	root, err := testutil.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	found, err := exportedErrors(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(found) < len(everyError)/2 {
		t.Fatalf("found %d exported errors under %s, the table has %d: the walk missed the tree", len(found), root, len(everyError))
	}
	for _, name := range found {
		e, ok := everyError[name]
		if !ok {
			t.Errorf("%s: an exported error missing from everyError; add it, in the category its doc comment names", name)
			continue
		}
		for _, err := range []error{e.err, fmt.Errorf("detail: %w", e.err)} {
			if got := status.CodeOf(err); got != e.want {
				t.Errorf("%s: CodeOf(%v) = %s, want %s", name, err, got, e.want)
			}
		}
		reason, allowed := internalAllowed[name]
		switch {
		case e.want == tcproto.CodeINTERNAL && !allowed:
			t.Errorf("%s maps to INTERNAL: put it in the category it belongs to, or list it in internalAllowed with why", name)
		case e.want != tcproto.CodeINTERNAL && allowed:
			t.Errorf("%s is in internalAllowed and maps to %s: drop it from the list", name, e.want)
		case allowed && !slices.ContainsFunc(internalKinds, func(k string) bool {
			return strings.HasPrefix(reason, k) && len(reason) > len(k)
		}):
			t.Errorf("%s: reason %q does not start with one of %q and say why", name, reason, internalKinds)
		}
	}
	for name := range everyError {
		if !slices.Contains(found, name) {
			t.Errorf("%s: in everyError, and no package declares it (renamed or removed?)", name)
		}
	}
	for name := range internalAllowed {
		if _, ok := everyError[name]; !ok {
			t.Errorf("%s: in internalAllowed, not in everyError", name)
		}
	}
}

// The finder finds an error planted in a source tree, under its package's
// directory, and nothing it must not: unexported, non-error or local
// variables, constants, test files, testdata, hidden directories and
// package main.
func TestExportedErrorsFinder(t *testing.T) {
	root := t.TempDir()
	write := func(rel, src string) { t.Helper(); testutil.Plant(t, root, rel, src) }
	write("go.mod", "module example.com/planted\n")
	write("root.go", "package planted\n\nimport \"errors\"\n\nvar ErrAtRoot = errors.New(\"planted: root\")\n")
	write("a/errors.go", `package a

import "errors"

var ErrPlanted = errors.New("a: planted")

var (
	errHidden         = errors.New("a: hidden")
	ErrTyped    error = errHidden
	ErrCount    int
	NotAnError        = errors.New("a: not named Err")
)

const ErrConst = "a: constant"

func f() error {
	var ErrLocal = errors.New("a: local")
	return ErrLocal
}
`)
	write("a/errors_test.go", "package a\n\nimport \"errors\"\n\nvar ErrInTest = errors.New(\"a: test\")\n")
	write("a/testdata/x.go", "package x\n\nimport \"errors\"\n\nvar ErrInTestdata = errors.New(\"x\")\n")
	write(".hidden/h.go", "package h\n\nimport \"errors\"\n\nvar ErrHidden = errors.New(\"h\")\n")
	write("cmd/tool/main.go", "package main\n\nimport \"errors\"\n\nvar ErrMain = errors.New(\"main\")\n\nfunc main() {}\n")
	write("b/c/deep.go", "package c\n\nimport \"fmt\"\n\nvar ErrDeep = fmt.Errorf(\"c: %w\", ErrOther)\n")
	write("b/c/other_linux.go", "//go:build linux\n\npackage c\n\nimport \"errors\"\n\nvar ErrOther = errors.New(\"c: other\")\n")
	write("b/c/other_stub.go", "//go:build !linux\n\npackage c\n\nimport \"errors\"\n\nvar ErrOther = errors.New(\"c: other\")\n")

	got, err := exportedErrors(root)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"ErrAtRoot", "a.ErrPlanted", "a.ErrTyped", "b/c.ErrDeep", "b/c.ErrOther"}
	if !slices.Equal(got, want) {
		t.Fatalf("found %q, want %q", got, want)
	}

	// A file that does not parse fails the walk: it could hide an error.
	write("d/broken.go", "package d\n\nvar ErrBroken = \n")
	if got, err := exportedErrors(root); err == nil {
		t.Fatalf("a tree with a file that does not parse: found %q and no error", got)
	}
}
