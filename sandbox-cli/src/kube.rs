//! `strata kube render`: the agent-sandbox objects of a tier or profile, as YAML
//! ([`sandbox_kube::render`]); `strata kube apply`: the template and warm pool created on a
//! cluster ([`sandbox_kube::backend::apply`]).

use std::process::ExitCode;

use sandbox_kube::{render, to_yaml, Boundary, EgressProxy, RenderInput};
use strata::policy::Tier;
use strata::Profile;

use crate::args::{KubeApplyArgs, KubeRenderArgs};

/// The render input the arguments describe.
fn input(args: &KubeRenderArgs) -> Result<RenderInput, String> {
    let boundary: Boundary = args.boundary.parse().map_err(|e| format!("{e}"))?;
    let mut input = match (&args.tier, &args.profile) {
        (Some(name), _) => {
            // Only the tier's network scope goes into the objects; its home is irrelevant.
            let tier = Tier::lookup(name, &[], None).map_err(|e| e.to_string())?;
            RenderInput::for_tier(&tier, args.image.clone(), boundary)
        }
        (None, Some(path)) => {
            let profile = Profile::load(path).map_err(|e| e.to_string())?;
            let name = profile.tier.clone().unwrap_or_else(|| {
                path.file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default()
            });
            RenderInput::new(name, args.image.clone(), boundary, profile.caps)
        }
        (None, None) => return Err("give --profile FILE or --tier NAME".into()),
    };
    if let Some(name) = &args.name {
        input.name = name.clone();
    }
    if let Some(ns) = &args.namespace {
        input = input.with_namespace(ns.clone());
    }
    if let Some(proxy) = &args.egress_proxy {
        let proxy: EgressProxy = proxy.parse().map_err(|e| format!("{e}"))?;
        input = input.with_egress_proxy(proxy);
    }
    Ok(input.with_warm_pool(args.warm_pool))
}

/// Prints the YAML stream, or the reason nothing can be rendered (exit 2).
pub fn render_command(args: &KubeRenderArgs) -> ExitCode {
    let yaml = input(args).and_then(|input| {
        render(&input)
            .and_then(|rendered| to_yaml(&rendered))
            .map_err(|e| e.to_string())
    });
    match yaml {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(why) => {
            eprintln!("strata: invalid request: {why}");
            ExitCode::from(2)
        }
    }
}

/// Applies the template and warm pool; prints what happened to each (exit 0), or why not
/// (exit 2 for a request that cannot be rendered, 1 for the cluster's refusal).
pub fn apply_command(args: &KubeApplyArgs) -> ExitCode {
    let namespace = args
        .render
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let rendered = match input(&args.render).and_then(|input| {
        render(&input.with_namespace(namespace.clone())).map_err(|e| e.to_string())
    }) {
        Ok(rendered) => rendered,
        Err(why) => {
            eprintln!("strata: invalid request: {why}");
            return ExitCode::from(2);
        }
    };
    match sandbox_kube::backend::apply(args.kubeconfig.as_deref(), &namespace, &rendered) {
        Ok(applied) => {
            let template = rendered
                .template
                .metadata
                .name
                .as_deref()
                .unwrap_or_default();
            let pool = rendered
                .warm_pool
                .metadata
                .name
                .as_deref()
                .unwrap_or_default();
            println!(
                "SandboxTemplate {namespace}/{template}: {:?}",
                applied.template
            );
            println!(
                "SandboxWarmPool {namespace}/{pool}: {:?}",
                applied.warm_pool
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("strata: {e}");
            ExitCode::from(1)
        }
    }
}
