//! What the microVM and cluster backends share: the far end of the run is Strata's agent
//! (`strata-guest-agent`), reached over a byte channel that a VM or a pod provides.
//!
//! Module map: [`protocol`] (frames, messages, decoder), [`applied`] (the host's check of
//! what the agent applied), [`place`] (where the agent runs,
//! and every message worded for it), [`carrier`] (what a VM or a pod provides: the channel,
//! whether it ended, diagnostics, teardown), [`driver`] (one run over a carrier: greeting,
//! request, stdin, output, wall clock, read-write grants back), [`inner`] (the sandbox the
//! agent runs the tool in: the plan, the parse of its result, the merge of its receipt),
//! [`request`] (the agent's run request, built once from the caps and the place's base),
//! [`window`] (bytes in flight per stream of a live sandbox's channel).
//! The guest agent binary is `src/bin/strata-guest-agent/` (`main.rs`; `live.rs` serves live sandboxes).
//!
//! This crate depends on `sandbox-core` only, so the cluster backend does not build the
//! microVM backend and neither backend depends on the other.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod applied;
pub mod carrier;
pub mod driver;
pub mod inner;
pub mod place;
pub mod protocol;
pub mod request;
pub mod window;

pub use carrier::Carrier;
pub use place::Place;
