//! Strata's cluster backend on [kubernetes-sigs/agent-sandbox]: the objects.
//!
//! A tier or profile becomes one `SandboxTemplate` (the hardened pod and its network
//! policy) and one `SandboxWarmPool`; a run or session becomes a `SandboxClaim` on the
//! pool, from which the claim controller makes a `Sandbox`. [`render()`] writes all four for
//! a [`RenderInput`], [`to_yaml`] prints them, and [`check::Pinned`] checks them against
//! upstream's CRD schemas and its `secure-sandbox-policy` admission policy.
//!
//! ```
//! use sandbox_policy::Tier;
//! use sandbox_kube::{render, to_yaml, Boundary, RenderInput};
//!
//! let input = RenderInput::for_tier(&Tier::low(), "ghcr.io/example/tools:1", Boundary::Gvisor);
//! let rendered = render(&input).unwrap();
//! let pod = &rendered.template.spec.pod_template.spec;
//! assert_eq!(pod.runtime_class_name.as_deref(), Some("gvisor"));
//! assert_eq!(pod.automount_service_account_token, Some(false));
//! assert!(rendered.template.spec.network_policy.egress.is_empty()); // tier low: no network
//! assert!(to_yaml(&rendered).unwrap().contains("kind: SandboxWarmPool"));
//! ```
//!
//! With the cargo feature `client`, [`client::Cluster`] applies the objects to a cluster
//! through kube-rs, claims sandboxes, waits for a claim to bind and releases it.
//!
//! [kubernetes-sigs/agent-sandbox]: https://github.com/kubernetes-sigs/agent-sandbox

#![deny(missing_docs)]

#[cfg(feature = "backend")]
pub mod backend;
pub mod check;
#[cfg(feature = "client")]
pub mod client;
pub mod crd;
#[cfg(feature = "fake")]
pub mod fake;
pub mod render;

pub use crd::{Kind, Sandbox, SandboxClaim, SandboxTemplate, SandboxWarmPool};
pub use render::{
    render, to_yaml, Boundary, EgressProxy, Placement, RenderError, RenderInput, Rendered,
};
