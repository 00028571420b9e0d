//! `strata snapshot | snapshots | fork | start --from | pause --to-disk`: snapshots of live
//! sandboxes (see `docs/live.md`). The store is the user's (`$STRATA_SNAPSHOT_DIR`, else
//! `~/.local/share/strata/snapshots`; see `strata::live::SnapshotStore::open_default`).

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use strata::live::{Forked, LiveSandbox, SnapshotInfo, SnapshotStore, StartOptions};
use strata::{BackendKind, Error};

use crate::args::{Cli, Command, LiveCommand, RunArgs};
use crate::{fail, say};

/// `strata snapshot ID [--name N]`, or `strata snapshot rm NAME`.
pub fn snapshot(target: &str, removed: Option<&str>, name: Option<&str>, json: bool) -> ExitCode {
    let done = match (target, removed) {
        ("rm", Some(removed)) => SnapshotStore::open_default().and_then(|store| store.remove(removed)),
        (_, Some(extra)) => Err(Error::invalid(format!(
            "strata snapshot takes one sandbox (strata snapshot ID [--name N]); {extra:?} is extra (strata snapshot rm NAME removes one)"
        ))),
        (id, None) => {
            let made = SnapshotStore::open_default().and_then(|store| {
                LiveSandbox::attach(id).and_then(|sandbox| sandbox.snapshot(&store, name))
            });
            return match made {
                Ok(info) => {
                    print_line(&if json {
                        snapshot_json(&info).to_string()
                    } else {
                        info.name.clone()
                    });
                    ExitCode::SUCCESS
                }
                Err(e) => fail(&e, json),
            };
        }
    };
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e, json),
    }
}

/// `strata snapshots`.
pub fn list(json: bool) -> ExitCode {
    let list = match SnapshotStore::open_default().and_then(|store| store.list()) {
        Ok(list) => list,
        Err(e) => return fail(&e, json),
    };
    if json {
        let value: Vec<_> = list.iter().map(snapshot_json).collect();
        print_line(&serde_json::Value::from(value).to_string());
        return ExitCode::SUCCESS;
    }
    for info in list {
        print_line(&format!(
            "{}  {}  {}  {} files  {} bytes  of {}",
            info.name, info.id, info.backend, info.files, info.bytes, info.source
        ));
    }
    ExitCode::SUCCESS
}

/// `strata fork ID [--count N]`: prints the children's ids.
pub fn fork(
    id: &str,
    count: usize,
    ttl: Option<f64>,
    idle_ttl: Option<f64>,
    json: bool,
) -> ExitCode {
    let forked = (|| -> strata::Result<Forked> {
        let options = StartOptions {
            ttl: crate::live::seconds("ttl", ttl)?,
            idle_ttl: crate::live::seconds("idle-ttl", idle_ttl)?,
            owned: false,
            ..StartOptions::default()
        };
        let store = SnapshotStore::open_default()?;
        LiveSandbox::attach(id)?.fork(&store, count, &options)
    })();
    match forked {
        Ok(forked) => {
            let ids: Vec<&str> = forked.children.iter().map(LiveSandbox::id).collect();
            if json {
                print_line(
                    &serde_json::json!({
                        "ids": ids,
                        "carries": forked.snapshot.carries,
                        "not_carried": forked.snapshot.not_carried,
                    })
                    .to_string(),
                );
            } else {
                print_line(&ids.join("\n"));
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e, json),
    }
}

/// `strata start --from SNAPSHOT`: the snapshot's caps, policy and backend; `run` must
/// hold no caps flags (a `--backend` must name the snapshot's).
pub fn start_from(
    from: &str,
    mut run: RunArgs,
    options: StartOptions,
) -> strata::Result<LiveSandbox> {
    let store = SnapshotStore::open_default()?;
    let snapshot = store.load(from)?;
    let backend = snapshot.info().backend;
    if run.backend != "auto" && run.backend != backend.to_string() {
        return Err(Error::invalid(format!(
            "snapshot {from:?} was taken on the {backend} backend; it starts there (drop --backend {})",
            run.backend
        )));
    }
    run.backend = "auto".into();
    run.json = false;
    if format!("{run:?}") != format!("{:?}", bare_start_args()?) {
        return Err(Error::invalid(format!(
            "strata start --from takes the snapshot's caps and policy: drop the caps flags (keep --name, --ttl, --idle-ttl, --publish, --json); {from:?} carries {}",
            snapshot.info().carries.join(", ")
        )));
    }
    if backend == BackendKind::Microvm {
        return Err(Error::unavailable(
            backend,
            "starting from a microVM snapshot is not built yet",
        ));
    }
    snapshot.start(&options)
}

/// What `strata start` with no flags parses to.
fn bare_start_args() -> strata::Result<RunArgs> {
    match Cli::try_parse_from(["strata", "start"]) {
        Ok(Cli {
            command: Command::Live(LiveCommand::Start(args)),
        }) => Ok(args.run),
        _ => Err(Error::invalid(
            "strata start: cannot parse its own defaults",
        )),
    }
}

/// `strata pause --to-disk ID`.
pub fn pause_to_disk(id: &str) -> ExitCode {
    let refused = LiveSandbox::attach(id).and_then(|sandbox| {
        let backend = sandbox.info().backend;
        Err(match backend {
            BackendKind::Microvm => Error::unavailable(
                backend,
                "saving a paused microVM to disk is not built yet; strata pause keeps it in memory",
            ),
            _ => Error::unavailable(
                backend,
                format!("the {backend} backend cannot save processes to disk (pause keeps them in memory; strata snapshot saves the sandbox's files)"),
            ),
        })
    });
    match refused {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e, false),
    }
}

fn snapshot_json(info: &SnapshotInfo) -> serde_json::Value {
    serde_json::json!({
        "id": info.id,
        "name": info.name,
        "backend": info.backend,
        "source": info.source,
        "created_at": info.created_at,
        "carries": info.carries,
        "not_carried": info.not_carried,
        "files": info.files,
        "bytes": info.bytes,
    })
}

fn print_line(line: &str) {
    let mut stdout = std::io::stdout();
    if writeln!(stdout, "{line}")
        .and_then(|()| stdout.flush())
        .is_err()
    {
        say("could not write to stdout");
    }
}
