//! Strata's policy layer: which runs a caller may ask for, where they run, who may raise them,
//! and which agents trust each other. Every decision here is data in, data out: no OS code,
//! no clocks read (callers pass `now`), so each rule is a pure function with its own tests.
//! The facade (`strata::policy` re-exports this crate) applies it before a backend runs;
//! `sandbox-core` holds only what a receipt and a run context carry of it ([`Risk`],
//! [`Route`], [`Grant`]).
//!
//! - [`tier`]: named presets of what a run may ask for (`high`, `medium`, `low`, or the
//!   embedder's own); [`Tier::check`] lists the [`Need`]s a request has beyond its tier.
//! - [`mod@route`]: picks the backend from the tool and a declared [`Risk`], never falling to a
//!   weaker boundary unless the caller allowed it; the [`Route`] goes in the receipt.
//! - [`elevation`]: escape hatches. An [`Approver`] may grant needs beyond the tier, scoped
//!   to named capabilities, expiring by time and by number of runs ([`GrantBook`]). It sees
//!   the whole request ([`ElevationRequest`]: the needs, the whole argv or script, the caps);
//!   [`prompt`] renders it for a human with everything from the agent escaped.
//! - [`message`]: agents with keys, messages signed over every field (HMAC-SHA256 with
//!   per-pair keys, or Ed25519), a timestamp window, a replay cache, and trust ranks that
//!   decide who may message and delegate to whom.
//! - [`toolcall`]: the narrowest caps for one tool call, from the tool's JSON schema and the
//!   call's arguments.
//! - [`workspace`]: the diff of a transactional workspace and which of it may be committed.
//!
//! Capabilities are named by short strings, the same in refusals, approval requests, grants
//! and the audit log: `read:PATH`, `write:PATH`, `net:allow`, `net:host`, `program:NAME`,
//! `secrets`.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod elevation;
pub mod message;
pub mod prompt;
pub mod route;
pub mod tier;
pub mod toolcall;
pub mod workspace;

pub use elevation::{
    admit, admit_needs, Admission, Approval, Approver, ElevationRequest, Grant, GrantBook,
    GrantCheck, GrantId, ScriptRequest,
};
pub use route::{route, BackendOffer, Risk, Route, RoutePolicy};
pub use tier::{Need, NetScope, PathScope, ProgramScope, Tier};
pub use toolcall::{derive_caps, derive_for_tier, Annotation, ArgumentCap, Derived};
