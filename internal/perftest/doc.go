// Package perftest is vrdma-guest's measurement core (one device per VM),
// whose Result (the JSON contract) and data pattern vrdma-perf shares: an
// RC QP pair, a bandwidth pass (tx-depth operations in flight, like
// ib_write_bw) and a latency pass (one at a time) for write, read, send
// and atomic (fetch-and-add), with verification. Only a verifying run
// fills its messages with the pattern: a fill per operation would cost
// the copy the run measures.
//
// The two sides may live in different processes: each creates its
// resources (NewSide) and publishes an Endpoint (GID, QPN, initial PSN,
// rkey, address, size); the harness exchanges the endpoints out of band. The server
// (Serve) is passive for write, read and atomic and posts receives for
// send; the client (Run) measures. Control messages travel as SENDs on the
// same QP: the client's hello (retried until the server's QP is ready to
// receive), and at the end the client's "done" carrying its measurements,
// answered by the server's verdict after it verified its own buffer, so
// both sides report verified=true only when both checked the data.
//
// Config.Duration turns the bandwidth pass into a stream that runs until
// the duration has passed (a live migration's harness spans the migration
// with it); the server of a send stream cannot count its receives in
// advance, so it posts them until the client's done arrives in one, a SEND
// with immediate data. Results carry the bytes moved and the longest gap
// between completions (max_gap_ms): the stream's longest pause.
//
// Non-goals: UD, multiple QPs.
//
// Invariants: every wait is bounded (Config.Timeout without progress);
// completions are checked in order; receives are posted before the peer can
// need them (RC's RNR retry covers the rest).
package perftest
