// Package webhook serves fencekeeper's fencing admission webhook and builds
// its configuration.
//
// The webhook is a mutating admission webhook (fenced.fencekeeper.io, served
// at FencingPath). Its configuration (FencingWebhookConfiguration) sends it
// only objects of the guarded kinds (ConfigMaps by default, plus listed
// custom resources) that carry the fencekeeper.io/lock label, on the old or
// the new object, so unfenced objects never depend on it; for fenced ones it
// fails closed and is never reinvoked.
//
// FencingHandler decodes each CREATE, UPDATE or DELETE, looks the lock up
// only when a rule needs it, and applies the rules of docs/design.md §3:
// fencing.Decide, then fencing.CheckIdentity (an epoch is accepted only
// from the identity its claim is bound to). An accepted content write is
// rewritten in the same admission hop that checked it: its
// fencekeeper.io/epoch token is removed and its fencekeeper.io/fenced-epoch
// watermark set to the presented epoch. Admission runs inside the
// apiserver's compare-and-swap loop for updates and patches, so the check
// against the stored watermark is atomic with the write. A refusal is 403
// or 422 with a machine-readable cause, never 409, so clients do not retry
// it. Writes to the status subresource are not checked for content, but
// cannot change what fences the object (fencing metadata they leave out is
// put back). Writes to the scale subresource (a second webhook,
// fenced-scale.fencekeeper.io) are checked like a content write of the
// object, which is read live because a Scale carries no labels.
//
// The lock's state comes from its Lease. The Lease is read live unless the
// lock authority running in this process (Authority) vouches that the
// manager's informer cache is fresh for that lock: this process is the only
// authority (leader election is on and its leadership is certain, or it
// runs with --single-authority), the cache names the holder epoch the
// authority last decided on, the authority has issued nothing newer, and
// the holder's lease has not lapsed on the authority's own clock. A lock
// the cache shows free is taken from the cache when an authority runs here.
// Everything else reads live: a process without an authority, a presented
// epoch above the last one the cache shows issued, a Lease missing from the
// cache, a holder the authority does not vouch for. A live read that fails
// refuses the write (503). A DELETE also reads the namespace live (deletes
// in a terminating namespace pass), and the identity check of an older epoch
// reads its claim from the cache.
package webhook
