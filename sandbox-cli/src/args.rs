//! Command-line arguments (the contract in DESIGN.md) and their translation to caps.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use strata::{
    grant, Access, BackendChoice, ByteSize, Caps, ContainerRuntime, Error, Mount, Net, Result,
    ScriptLanguage, Strictness, Tool,
};

/// Run AI-agent tools in sandboxes.
#[derive(Debug, Parser)]
#[command(name = "strata", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a program (or, with --script, source code) in a sandbox.
    Run(Box<RunArgs>),
    /// Report which backends and guarantees this host supports, and why not.
    Doctor {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Work with audit logs (`strata run --audit FILE`).
    #[command(subcommand)]
    Audit(AuditCommand),
    /// Serve sandboxed runs and sessions to AI agents over the Model Context Protocol
    /// (stdio, or streamable HTTP with --http). Every run gets the profile's caps; a client
    /// cannot widen them.
    Mcp(McpArgs),
    /// Serve E2B's API (control plane and envd) so the official E2B SDKs drive live
    /// sandboxes: `E2B_API_URL=http://ADDR E2B_SANDBOX_URL=http://ADDR E2B_API_KEY=KEY`.
    Serve(ServeArgs),
    /// Kubernetes (kubernetes-sigs/agent-sandbox): the objects a tier or profile becomes.
    #[command(subcommand)]
    Kube(KubeCommand),
    #[command(flatten)]
    Live(LiveCommand),
}

/// Live sandboxes: `strata start`, then `exec`, `ps`, `logs`, `kill`, `pause`, `resume`,
/// `cp`, `stop`, `ls`; `snapshot`, `snapshots`, `fork`.
#[derive(Debug, Subcommand)]
pub enum LiveCommand {
    /// Start a live sandbox (default backend: process) with the caps of `strata run`'s
    /// flags, print its id and return; it stays up until `strata stop ID`, its --ttl or
    /// --idle-ttl. Exec into it with `strata exec ID -- PROGRAM`.
    Start(Box<StartArgs>),
    /// Run a program in a live sandbox: in the foreground (its output streams, strata exits
    /// with its code, 124 after --timeout) or with --detach (prints its pid).
    Exec(ExecArgs),
    /// List a live sandbox's processes (the pid is the last word of each line).
    Ps {
        /// The sandbox's id or name.
        id: String,
        /// Print JSON: [{pid, argv, state: running|exited, exit_code, signal, timed_out}].
        #[arg(long)]
        json: bool,
    },
    /// Print a process's kept output (the last 1 MiB); with --follow, until it exits.
    Logs {
        /// The sandbox's id or name.
        id: String,
        /// The process.
        pid: i32,
        /// Keep printing until the process exits.
        #[arg(long)]
        follow: bool,
    },
    /// Send a signal (default TERM) to a process of a live sandbox and its process group.
    Kill {
        /// The sandbox's id or name.
        id: String,
        /// The process.
        pid: i32,
        /// A name (TERM, KILL, INT, HUP, ...) or number.
        #[arg(long, default_value = "TERM")]
        signal: String,
    },
    /// End a live sandbox: every process (also those that left with setsid), its
    /// namespaces, cgroup and state. Returns once all of it is gone.
    Stop {
        /// The sandbox's id or name.
        id: String,
    },
    /// Pause every process of a live sandbox (the cgroup freezer where there is one):
    /// nothing runs and its TTLs stand still until `strata resume`; `logs` and `ps` work.
    Pause {
        /// The sandbox's id or name.
        id: String,
        /// Save the paused sandbox to disk and release its memory (a microVM's memory;
        /// the process and container backends cannot save processes and refuse).
        #[arg(long = "to-disk")]
        to_disk: bool,
    },
    /// Snapshot a live sandbox (`strata snapshot ID [--name N]`): on the process and
    /// container backends its own files (/tmp, a private working directory), caps and
    /// policy, owner-only and sealed; `strata start --from NAME` starts one from it.
    /// `strata snapshot rm NAME` removes one.
    Snapshot {
        /// The sandbox's id or name (or `rm`, followed by a snapshot's name).
        target: String,
        /// With `rm`: the snapshot to remove.
        removed: Option<String>,
        /// The snapshot's name (default: its id).
        #[arg(long, value_name = "NAME")]
        name: Option<String>,
        /// Print JSON: {id, name, backend, source, carries, not_carried, files, bytes}.
        #[arg(long)]
        json: bool,
    },
    /// List your snapshots.
    Snapshots {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Start copies of a live sandbox (each with its own copy of its files, the same caps
    /// and policy) and print their ids, one per line.
    Fork {
        /// The sandbox's id or name.
        id: String,
        /// How many children (1-100).
        #[arg(long, default_value_t = 1)]
        count: usize,
        /// End each child this many seconds after it started.
        #[arg(long, value_name = "SECONDS")]
        ttl: Option<f64>,
        /// End each child after this many seconds without a client request.
        #[arg(long = "idle-ttl", value_name = "SECONDS")]
        idle_ttl: Option<f64>,
        /// Print JSON: {ids, carries}.
        #[arg(long)]
        json: bool,
    },
    /// Resume a paused live sandbox.
    Resume {
        /// The sandbox's id or name.
        id: String,
    },
    /// Copy a file or directory into or out of a live sandbox: `strata cp ID:PATH HOST_PATH`
    /// or `strata cp HOST_PATH ID:PATH` (a directory there receives the copy by its name).
    /// Regular files and directories only; a symlink, device or hard-linked file in the
    /// sandbox refuses the copy before anything is written; nothing of yours is
    /// overwritten by a copy out.
    Cp {
        /// `ID:PATH` or a host path.
        from: String,
        /// `ID:PATH` or a host path.
        to: String,
    },
    /// List your live sandboxes.
    Ls {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `strata start`.
#[derive(Debug, Args)]
pub struct StartArgs {
    /// The caps, as for `strata run` (no program).
    #[command(flatten)]
    pub run: RunArgs,
    /// End the sandbox this many seconds after it started.
    #[arg(long, value_name = "SECONDS")]
    pub ttl: Option<f64>,
    /// End the sandbox after this many seconds without a client request.
    #[arg(long = "idle-ttl", value_name = "SECONDS")]
    pub idle_ttl: Option<f64>,
    /// Freeze the sandbox after this many seconds without a client request or a
    /// connection through a published port; the next exec, followed log or connection
    /// resumes it (its TTLs stand still meanwhile).
    #[arg(long = "idle-pause", value_name = "SECONDS")]
    pub idle_pause: Option<f64>,
    /// A name to use instead of the id (unique among your live sandboxes).
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Publish a TCP port the tool listens on inside to the host: `[IP:]HOST_PORT:GUEST_PORT`,
    /// or `GUEST_PORT` alone (loopback, a free host port; `--json` and `strata ls --json`
    /// show it). Default IP 127.0.0.1. Only that port is reachable; egress is unchanged.
    #[arg(long, value_name = "[IP:]HOST:GUEST")]
    pub publish: Vec<String>,
    /// Start from a snapshot (`strata snapshots`): its caps, policy, backend and files.
    /// Caps flags are refused with it (the snapshot's caps are the sandbox's).
    #[arg(long, value_name = "SNAPSHOT")]
    pub from: Option<String>,
}

/// `strata exec`.
#[derive(Debug, Args)]
pub struct ExecArgs {
    /// The sandbox's id or name.
    pub id: String,
    /// Start it in the background and print its pid (see `strata ps`, `logs`, `kill`).
    #[arg(long)]
    pub detach: bool,
    /// Run it on a new terminal (a pseudo-terminal in the sandbox's supervisor) of your
    /// terminal's size, kept in step when yours is resized; your keystrokes go to it raw
    /// (^C reaches the program) and its output comes back unfiltered, as with `docker exec
    /// -t` or ssh. Your own terminal is never handed to the program.
    #[arg(long)]
    pub tty: bool,
    /// Set a variable for this exec (KEY=VALUE; repeatable).
    #[arg(long, value_name = "K=V")]
    pub env: Vec<String>,
    /// Working directory inside the sandbox.
    #[arg(long, value_name = "DIR")]
    pub workdir: Option<String>,
    /// Kill the exec's process group after this many seconds (exit code 124).
    #[arg(long, value_name = "SECONDS")]
    pub timeout: Option<f64>,
    /// Stream this process's standard input to the program.
    #[arg(long)]
    pub stdin: bool,
    /// Print one JSON object: pid, exit_code, signal, timed_out, stdout, stderr.
    #[arg(long)]
    pub json: bool,
    /// The program and its arguments.
    #[arg(last = true, required = true, value_name = "PROGRAM")]
    pub command: Vec<String>,
}

/// `strata kube ...`.
#[derive(Debug, Subcommand)]
pub enum KubeCommand {
    /// Print the YAML of the four agent-sandbox objects of a tier or profile (a
    /// SandboxTemplate with the hardened pod and its network policy, a SandboxWarmPool, a
    /// SandboxClaim, and the Sandbox the claim controller makes, which the admission
    /// policy sees). `kubectl create -f -` takes it.
    Render(KubeRenderArgs),
    /// Create or update a tier's SandboxTemplate and SandboxWarmPool on the cluster of a
    /// kubeconfig (idempotent: unchanged objects are left alone, changed ones replaced).
    /// Then `strata run --backend cluster --tier TIER` claims pods from the pool.
    Apply(KubeApplyArgs),
}

/// `strata kube apply`.
#[derive(Debug, Args)]
pub struct KubeApplyArgs {
    /// What to apply (the namespace defaults to `default`).
    #[command(flatten)]
    pub render: KubeRenderArgs,
    /// The kubeconfig of the cluster (default: $KUBECONFIG, else ~/.kube/config); an https
    /// server is verified against its certificate authority.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
}

/// `strata kube render`.
#[derive(Debug, Args)]
pub struct KubeRenderArgs {
    /// The profile whose caps (limits, network) and tier name the objects carry.
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with = "tier",
        required_unless_present = "tier"
    )]
    pub profile: Option<PathBuf>,
    /// A built-in tier (low, medium, high) instead of a profile.
    #[arg(long, value_name = "NAME")]
    pub tier: Option<String>,
    /// The pod's image; it must hold the Strata guest agent at /strata/strata-guest-agent.
    #[arg(long, value_name = "IMAGE")]
    pub image: String,
    /// The runtime class: gvisor (default), kata-qemu or kata-fc.
    #[arg(long, value_name = "CLASS", default_value = "gvisor")]
    pub boundary: String,
    /// The objects' name suffix (strata-NAME). Default: the tier's name, else the profile
    /// file's stem.
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// The namespace of every object. Default: none (kubectl's current namespace).
    #[arg(long, value_name = "NS")]
    pub namespace: Option<String>,
    /// Pods the warm pool keeps started.
    #[arg(long = "warm-pool", value_name = "N", default_value_t = 1)]
    pub warm_pool: u32,
    /// The egress proxy the pods may reach (needed when the network is an allowlist):
    /// IP:PORT, or pods:NAMESPACE/LABEL=VALUE[,...]:PORT.
    #[arg(long = "egress-proxy", value_name = "PROXY")]
    pub egress_proxy: Option<String>,
}

/// `strata mcp`.
#[derive(Debug, Args)]
pub struct McpArgs {
    /// The profile (TOML, or JSON for *.json) of every run and session: caps, backend,
    /// strictness, tier and risk. Default: the default caps (no mounts, no network, 30 s).
    #[arg(long, value_name = "FILE")]
    pub profile: Option<PathBuf>,
    /// Serve streamable HTTP at ADDR (HOST:PORT; port 0 picks one) on the path /mcp,
    /// instead of stdio, and print its URL on stdout. There is no authentication: a
    /// non-loopback address needs --allow-host.
    #[arg(long, value_name = "ADDR")]
    pub http: Option<String>,
    /// With --http: also accept requests for HOST (the Host header; loopback names always
    /// pass), and allow a non-loopback ADDR.
    #[arg(long = "allow-host", value_name = "HOST", requires = "http")]
    pub allow_host: Vec<String>,
    /// The most sessions open at once. Default: the profile's `session.max_open` (16).
    #[arg(long = "max-sessions", value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub max_sessions: Option<u32>,
}

/// `strata serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Serve the E2B-compatible API at ADDR (HOST:PORT; port 0 picks one) and print its URL
    /// on stdout. Plain HTTP: a non-loopback ADDR needs --insecure-public (put TLS in front).
    #[arg(long, value_name = "ADDR")]
    pub e2b: String,
    /// The profile (TOML, or JSON for *.json) of every sandbox: caps, strictness, tier. A
    /// client cannot widen its caps (it may narrow the network). Default: the default caps
    /// (no mounts, no network).
    #[arg(long, value_name = "FILE")]
    pub profile: Option<PathBuf>,
    /// The API key clients send (X-API-KEY), at least 16 characters. Default:
    /// --api-key-file, else $E2B_API_KEY.
    #[arg(long = "api-key", value_name = "KEY", conflicts_with = "api_key_file")]
    pub api_key: Option<String>,
    /// A file of API keys, one per line (each key sees only its own sandboxes).
    #[arg(long = "api-key-file", value_name = "FILE")]
    pub api_key_file: Option<PathBuf>,
    /// The most sandboxes one API key has at once (running or paused).
    #[arg(long = "max-sandboxes", value_name = "N", default_value_t = 16,
          value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub max_sandboxes: u32,
    /// Another template: sandboxes created with template NAME get PROFILE's caps,
    /// strictness and tier, on the container backend when it names an image (`[caps.container]
    /// image = ...`), else on --backend. Repeatable. `base` is --profile's.
    #[arg(long = "template", value_name = "NAME=PROFILE")]
    pub templates: Vec<String>,
    /// The live backend of every sandbox: process, container or microvm.
    #[arg(long, value_name = "BACKEND", default_value = "process")]
    pub backend: String,
    /// Allow a non-loopback ADDR over plain HTTP (keys and tokens cross the network in
    /// the clear unless a TLS proxy is in front).
    #[arg(long = "insecure-public")]
    pub insecure_public: bool,
    /// Where E2B snapshots are kept, one 0700 store per API key. Default: `e2b/` in the
    /// user's snapshot store (`strata snapshots`' directory).
    #[arg(long = "snapshot-dir", value_name = "DIR")]
    pub snapshot_dir: Option<PathBuf>,
    /// The domain sandboxes report: the SDK's `get_host(port)` is `PORT-ID.DOMAIN`, and a
    /// request to this server with that Host reaches the sandbox's port. Default:
    /// `localhost:PORT` of ADDR (`*.localhost` is loopback to browsers, curl and
    /// systemd-resolved).
    #[arg(long, value_name = "DOMAIN")]
    pub domain: Option<String>,
}

/// `strata audit ...`.
#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// Check a log's hash chain: exit 0 when intact, 1 naming the first altered, removed or
    /// reordered record.
    Verify {
        /// The log (JSON lines).
        file: PathBuf,
        /// The last record's hash kept elsewhere: also detects records cut off the end.
        #[arg(long, value_name = "HASH")]
        head: Option<String>,
    },
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// auto, process, container, wasm, microvm or cluster (a pod of a Kubernetes cluster
    /// running agent-sandbox: see --kubeconfig, --warm-pool).
    #[arg(long, default_value = "auto")]
    pub backend: String,
    /// Grant read-only access to HOST, at GUEST inside (default: the same path). A relative
    /// HOST is taken from the current directory (without resolving '..', which is refused).
    /// A HOST with a symlink in any component is refused (see --ro-follow).
    #[arg(long = "ro", value_name = "HOST[:GUEST]")]
    pub read_only: Vec<String>,
    /// Grant read-write access to HOST, at GUEST inside (default: the same path). Existing
    /// host-executed paths inside it (.git/hooks, .git/config, .envrc, .vscode, ...) stay
    /// read-only (see --allow-host-executed-writes). Symlinks are refused as for --ro.
    #[arg(long = "rw", value_name = "HOST[:GUEST]")]
    pub read_write: Vec<String>,
    /// Like --ro, but follow symlinks in HOST and grant what they lead to (the receipt
    /// names it). Without it a symlink, perhaps planted by an earlier run, refuses the grant.
    #[arg(long = "ro-follow", value_name = "HOST[:GUEST]")]
    pub read_only_follow: Vec<String>,
    /// Like --rw, but follow symlinks in HOST.
    #[arg(long = "rw-follow", value_name = "HOST[:GUEST]")]
    pub read_write_follow: Vec<String>,
    /// Let the tool write the host-executed paths inside --rw grants (git hooks and config,
    /// .envrc, editor and CI files, shell start-up files), which the host may run later.
    #[arg(long = "allow-host-executed-writes")]
    pub allow_host_executed_writes: bool,
    /// Working directory inside the sandbox (default /tmp).
    #[arg(long)]
    pub workdir: Option<PathBuf>,
    /// Set an environment variable (the host environment is never inherited).
    #[arg(long = "env", value_name = "K=V")]
    pub env: Vec<String>,
    /// none (default), host, or allow:HOST[:PORT],...
    #[arg(long, default_value = "none")]
    pub net: String,
    /// Wall-clock timeout in seconds (default 30).
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<f64>,
    /// CPU time limit in seconds (default 30).
    #[arg(long = "cpu-time", value_name = "SECS")]
    pub cpu_time: Option<f64>,
    /// Memory limit, e.g. 256M (default 512M).
    #[arg(long, value_name = "SIZE")]
    pub memory: Option<String>,
    /// Maximum processes and threads (default 128).
    #[arg(long = "processes", visible_alias = "pids", value_name = "N")]
    pub processes: Option<u32>,
    /// Maximum bytes kept per output stream, e.g. 64K (default 1M); more ends the run.
    #[arg(long = "output", visible_alias = "max-output", value_name = "SIZE")]
    pub output: Option<String>,
    /// Size of the private /tmp and workdir (default 64M).
    #[arg(long, value_name = "SIZE")]
    pub disk: Option<String>,
    /// Bytes the run may move through the egress proxy under --net allow:..., both
    /// directions, all connections together, e.g. 100M (default 1G). Past it the connection
    /// is closed and later ones refused; the run goes on.
    #[arg(long = "egress-bytes", value_name = "SIZE")]
    pub egress_bytes: Option<String>,
    /// Connections the run may ask the egress proxy for, allowed or refused (default 1024).
    #[arg(long = "egress-connections", value_name = "N")]
    pub egress_connections: Option<u32>,
    /// Container image (container backend).
    #[arg(long, value_name = "REF")]
    pub image: Option<String>,
    /// Container runtime: native, docker, podman or runsc (container backend).
    #[arg(long)]
    pub runtime: Option<String>,
    /// A secret the tool may use only toward these hosts (with --net allow:...): the tool's
    /// variable NAME holds a placeholder, and the egress proxy puts the value of this
    /// process's own NAME in its place in request headers to the hosts (HTTPS through a
    /// per-run CA the sandbox trusts). Never put the value on the command line.
    #[arg(long = "secret", value_name = "NAME@HOST[,HOST...]")]
    pub secret: Vec<String>,
    /// Run as this agent: its own unprivileged host uid and gid, stable across runs
    /// (when strata runs as root); without it each run gets a fresh one.
    #[arg(long, value_name = "NAME")]
    pub agent: Option<String>,
    /// Run source code: python, javascript or sh; the code is the first argument after --.
    #[arg(long, value_name = "LANG")]
    pub script: Option<String>,
    /// Stream this process's standard input to the tool while it runs (never read whole:
    /// at most 64 KiB is buffered, a fast producer waits for the tool, and --timeout still
    /// ends the run while the input is open). Without it the tool's stdin is empty.
    #[arg(long)]
    pub stdin: bool,
    /// Pass the tool's output to a terminal unchanged. By default, when stdout or stderr is
    /// a terminal, every control sequence but SGR colours (cursor moves, OSC 52 clipboard
    /// writes, title changes, DCS, C1 and other control bytes) is shown escaped as text
    /// (e.g. \x1b]52;...) instead of acting. Pipes, files and --json are never changed.
    #[arg(long = "raw-output")]
    pub raw_output: bool,
    /// Run with what this host can enforce and list the gaps in the receipt, instead of
    /// refusing.
    #[arg(long = "best-effort")]
    pub best_effort: bool,
    /// Print one JSON object with the result and the receipt.
    #[arg(long)]
    pub json: bool,
    /// Read the caps from a JSON file (the shape of schema/caps.schema.json) instead of the
    /// caps flags, which are refused with it.
    #[arg(long = "caps", value_name = "FILE", conflicts_with_all = [
        "read_only", "read_write", "read_only_follow", "read_write_follow",
        "allow_host_executed_writes", "workdir", "env", "net", "timeout", "cpu_time", "memory",
        "processes", "output", "disk", "egress_bytes", "egress_connections", "image", "runtime",
        "secret", "agent",
    ])]
    pub caps_file: Option<PathBuf>,
    /// Read a profile (TOML, or JSON for *.json): its caps instead of the caps flags (which
    /// are refused with it), and its backend (unless --backend names one), strictness, tier,
    /// tiers and risk (unless --tier or --risk are given). See docs/policy.md.
    #[arg(long = "profile", value_name = "FILE", conflicts_with_all = [
        "caps_file", "read_only", "read_write", "read_only_follow", "read_write_follow",
        "allow_host_executed_writes", "workdir", "env", "net", "timeout", "cpu_time", "memory",
        "processes", "output", "disk", "egress_bytes", "egress_connections", "image", "runtime",
        "secret", "agent",
    ])]
    pub profile: Option<PathBuf>,
    /// Append a record of the run (or its refusal) to this audit log: JSON lines, each with
    /// the hash of the one before (check it with `strata audit verify FILE`). A log that
    /// does not verify is refused before anything runs.
    #[arg(long = "audit", value_name = "FILE")]
    pub audit: Option<PathBuf>,
    /// Check the run against a trust tier: low (read-only /tmp, no network), medium (the
    /// home directory, an allowlist, approved programs) or high (anything). A request
    /// beyond it is refused naming the tier and the capability, unless an approver grants
    /// it. The receipt names the tier.
    #[arg(long, value_name = "TIER")]
    pub tier: Option<String>,
    /// With --backend cluster: the kubeconfig of the cluster (default: $KUBECONFIG, else
    /// ~/.kube/config); an https server is verified against its certificate authority.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// With --backend cluster: the namespace of the warm pool and its claims.
    #[arg(long, value_name = "NS", default_value = "default")]
    pub namespace: String,
    /// With --backend cluster: the SandboxWarmPool to claim a pod from. Default: strata-TIER
    /// (as `strata kube apply --tier TIER` names it).
    #[arg(long = "warm-pool", value_name = "NAME")]
    pub warm_pool: Option<String>,
    /// With --backend cluster: the strata CLI in the pool's image (e.g. /strata/strata); the
    /// tool then runs under Strata's process backend inside the pod too. Default: none (the
    /// pod's runtime class is the boundary).
    #[arg(long = "inner-cli", value_name = "PATH")]
    pub inner_cli: Option<String>,
    /// With --backend cluster: where this process serves the egress proxy for an allowlist
    /// run. Default: the address the pool's template sends pods' egress to (`strata kube
    /// apply --egress-proxy IP:PORT`), which must be one of this machine's.
    #[arg(long = "egress-listen", value_name = "IP:PORT")]
    pub egress_listen: Option<std::net::SocketAddr>,
    /// Declare the tool's risk (compute, files, build or untrusted); with --backend auto
    /// the backend is chosen from it (untrusted: microvm; build: container; compute: wasm)
    /// and never a weaker one unless --allow-weaker. The receipt records the route.
    #[arg(long, value_name = "RISK")]
    pub risk: Option<String>,
    /// With --risk: accept a backend below the risk's floor when the preferred ones are
    /// unavailable (the receipt says so).
    #[arg(long = "allow-weaker")]
    pub allow_weaker: bool,
    /// Ask PROGRAM about requests beyond the tier: it gets the request as JSON on stdin
    /// ({agent, tier, tool, needs: [{capability, detail}], argv: [...] or script:
    /// {language, source, bytes, sha256}, caps, stdin_bytes}) and grants with exit 0
    /// (optionally printing {"ttl": MS, "runs": N}); any other exit refuses.
    #[arg(long, value_name = "PROGRAM", conflicts_with = "approve_interactive")]
    pub approver: Option<PathBuf>,
    /// Ask on the terminal about requests beyond the tier, showing what would run (the
    /// whole command line, or the script, truncated when long, with its size and SHA-256)
    /// and the caps; everything from the request is escaped.
    #[arg(long = "approve-interactive")]
    pub approve_interactive: bool,
    /// Also write the result as JSON to FILE when the run ends: status, limits and receipt
    /// (not the output, which streams as usual), or `{"error": {kind, message}}`.
    #[arg(long = "result-file", value_name = "FILE")]
    pub result_file: Option<PathBuf>,
    /// The program and its arguments (or the script source).
    #[arg(last = true, value_name = "PROGRAM")]
    pub command: Vec<String>,
}

/// A parsed `strata run`.
pub struct Request {
    pub backend: BackendChoice,
    pub strictness: Strictness,
    pub tool: Tool,
    pub caps: Caps,
    /// Stream this process's stdin to the tool.
    pub stdin: bool,
    /// Do not neutralise control sequences on a terminal.
    pub raw_output: bool,
    /// Where to write the result JSON (`--result-file`).
    pub result_file: Option<PathBuf>,
    /// The audit log (`--audit`).
    pub audit: Option<PathBuf>,
    /// The tier (`--tier`, else the profile's).
    pub tier: Option<String>,
    /// Tiers the profile defines.
    pub tiers: Vec<strata::policy::Tier>,
    /// The declared risk (`--risk`).
    pub risk: Option<strata::policy::Risk>,
    /// `--allow-weaker`.
    pub allow_weaker: bool,
    /// Who decides elevations (`--approver`, `--approve-interactive`).
    pub approver: Option<crate::approve::ApproverChoice>,
    /// The cluster of `--backend cluster`.
    pub cluster: Option<ClusterTarget>,
}

impl Request {
    /// The sandbox this request runs on: its backend and strictness, one run per process
    /// (no sandboxes built ahead of time, the host probe read from the state directory
    /// instead of probed on every start), and its policy (audit log, tiers, approver).
    pub fn sandbox_builder(&self) -> strata::SandboxBuilder {
        let mut builder = strata::Sandbox::builder()
            .backend(self.backend)
            .strictness(self.strictness)
            .warm_pool(0)
            .cache_host_probe(true);
        if let Some(path) = &self.audit {
            builder = builder.audit(path);
        }
        for tier in &self.tiers {
            builder = builder.define_tier(tier.clone());
        }
        if let Some(tier) = &self.tier {
            builder = builder.tier(tier);
        }
        if let Some(choice) = &self.approver {
            builder = builder.approver(choice.approver());
        }
        builder
    }
}

/// Where `--backend cluster` runs: `--kubeconfig`, `--namespace`, `--warm-pool`.
#[cfg_attr(not(feature = "kube"), allow(dead_code))]
pub struct ClusterTarget {
    pub kubeconfig: Option<PathBuf>,
    pub namespace: String,
    pub warm_pool: String,
    pub inner_cli: Option<String>,
    pub egress_listen: Option<std::net::SocketAddr>,
}

/// A `HOST[:GUEST]` argument as a mount: HOST made absolute against `cwd` (lexically), and
/// GUEST defaulting to that absolute HOST.
fn mount_arg(spec: &str, cwd: &Path, access: Access, follow: bool) -> Result<Mount> {
    let (host, guest) = match spec.split_once(':') {
        Some((host, guest)) if !guest.is_empty() => (host, Some(guest)),
        _ => (spec, None),
    };
    let host = grant::absolute(Path::new(host), cwd)?;
    let guest = guest.map_or_else(|| host.clone(), PathBuf::from);
    let mount = Mount::new(host, guest, access);
    Ok(if follow {
        mount.follow_symlinks()
    } else {
        mount
    })
}

fn size(flag: &str, value: &str) -> Result<ByteSize> {
    value
        .parse()
        .map_err(|e| Error::invalid(format!("--{flag}: {e}")))
}

/// `--secret NAME@HOST[,HOST...]`, the value from this process's environment.
fn secret(binding: &str) -> Result<strata::caps::Secret> {
    let (env, hosts) = binding
        .split_once('@')
        .filter(|(env, _)| !env.is_empty())
        .ok_or_else(|| {
            Error::invalid(format!(
                "--secret {binding:?}: expected NAME@HOST[,HOST...]"
            ))
        })?;
    let value = std::env::var(env).map_err(|_| {
        Error::invalid(format!(
            "--secret {env}: set the environment variable {env} to the secret's value for strata"
        ))
    })?;
    Ok(strata::caps::Secret {
        env: env.to_string(),
        value,
        hosts: hosts.split(',').map(str::to_string).collect(),
    })
}

fn seconds(flag: &str, value: f64) -> Result<Duration> {
    if value.is_finite() && value > 0.0 && value < 1e9 {
        Ok(Duration::from_secs_f64(value))
    } else {
        Err(Error::invalid(format!(
            "--{flag} must be a positive number of seconds, got {value}"
        )))
    }
}

impl RunArgs {
    /// Validates the arguments and builds the request. Nothing runs here.
    pub fn into_request(self) -> Result<Request> {
        if self.command.is_empty() {
            return Err(Error::invalid(
                "no program: give it after --, e.g. strata run -- echo hi",
            ));
        }
        let profile = self
            .profile
            .as_deref()
            .map(strata::Profile::load)
            .transpose()?;
        let mut backend: BackendChoice = self.backend.parse()?;
        if let (BackendChoice::Auto, Some(profile)) = (backend, &profile) {
            backend = profile.backend;
        }
        let microvm = backend == BackendChoice::Only(strata::BackendKind::Microvm);
        if self.runtime.is_some() && microvm {
            return Err(Error::invalid(
                "--runtime is for --backend container (the microvm backend runs images with the native runtime inside the guest)",
            ));
        }
        if self.image.is_some() || self.runtime.is_some() {
            if backend != BackendChoice::Only(strata::BackendKind::Container) && !microvm {
                return Err(Error::invalid(
                    "--image needs --backend container or microvm; --runtime needs --backend container",
                ));
            }
            if let Some(runtime) = &self.runtime {
                if runtime.parse::<ContainerRuntime>().is_err() {
                    return Err(Error::invalid(format!(
                        "--runtime {runtime:?}: expected native, docker, podman or runsc"
                    )));
                }
            }
        }
        let mut caps = match (&self.caps_file, &profile) {
            (Some(file), _) => {
                let text = std::fs::read_to_string(file)
                    .map_err(|e| Error::invalid(format!("--caps {}: {e}", file.display())))?;
                Caps::from_json(&text)?
            }
            (None, Some(profile)) => profile.caps.clone(),
            (None, None) => Caps::new(),
        };
        let grants = [
            (&self.read_only, Access::ReadOnly, false),
            (&self.read_write, Access::ReadWrite, false),
            (&self.read_only_follow, Access::ReadOnly, true),
            (&self.read_write_follow, Access::ReadWrite, true),
        ];
        if grants.iter().any(|(specs, _, _)| !specs.is_empty()) {
            let cwd = std::env::current_dir().map_err(|e| {
                Error::invalid(format!(
                    "cannot read the current directory to resolve mount paths: {e}"
                ))
            })?;
            for (specs, access, follow) in grants {
                for spec in specs {
                    caps = caps.with_mount(mount_arg(spec, &cwd, access, follow)?);
                }
            }
        }
        if self.allow_host_executed_writes {
            caps = caps.allow_host_executed_writes();
        }
        if let Some(workdir) = self.workdir {
            caps = caps.workdir(workdir);
        }
        for pair in &self.env {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| Error::invalid(format!("--env {pair:?}: expected KEY=VALUE")))?;
            caps = caps.env(key, value);
        }
        if self.caps_file.is_none() && profile.is_none() {
            caps.net = self.net.parse::<Net>()?;
        }
        if let Some(t) = self.timeout {
            caps.limits.timeout = seconds("timeout", t)?;
        }
        if let Some(t) = self.cpu_time {
            caps.limits.cpu_time = seconds("cpu-time", t)?;
        }
        if let Some(m) = &self.memory {
            caps.limits.memory = size("memory", m)?;
        }
        if let Some(p) = self.processes {
            caps.limits.processes = p;
        }
        if let Some(o) = &self.output {
            caps.limits.output = size("output", o)?;
        }
        if let Some(d) = &self.disk {
            caps.limits.disk = size("disk", d)?;
        }
        if let Some(b) = &self.egress_bytes {
            caps.limits.egress_bytes = size("egress-bytes", b)?;
        }
        if let Some(n) = self.egress_connections {
            caps.limits.egress_connections = n;
        }
        for binding in &self.secret {
            caps.secrets.push(secret(binding)?);
        }
        caps.agent = self.agent.clone();
        if let Some(image) = &self.image {
            caps = caps.image(image.clone());
            if let Some(runtime) = &self.runtime {
                caps = caps.runtime(runtime.parse::<ContainerRuntime>()?);
            }
        } else if backend == BackendChoice::Only(strata::BackendKind::Container)
            && caps.container.is_none()
        {
            return Err(Error::invalid(
                "--backend container needs --image REF (an OCI layout, an image archive, a root file system directory, or an engine image name)",
            ));
        }
        caps.validate()?;
        let tool = match &self.script {
            Some(language) => {
                let language: ScriptLanguage = language.parse()?;
                if self.command.len() != 1 {
                    return Err(Error::invalid(format!(
                        "--script takes exactly one argument after -- (the source code), got {}",
                        self.command.len()
                    )));
                }
                Tool::script(language, self.command[0].clone())
            }
            None => {
                let program = &self.command[0];
                let is_wasm = program.ends_with(".wasm") || program.ends_with(".wat");
                let wants_wasm = backend == BackendChoice::Only(strata::BackendKind::Wasm)
                    || (backend == BackendChoice::Auto && is_wasm)
                    || (backend == BackendChoice::Only(strata::BackendKind::Microvm) && is_wasm);
                if wants_wasm {
                    Tool::wasm(program, self.command[1..].iter().cloned())
                } else {
                    Tool::command(self.command.iter().cloned())
                }
            }
        };
        tool.validate()?;
        let tier = self
            .tier
            .or_else(|| profile.as_ref().and_then(|p| p.tier.clone()));
        let cluster = if backend == BackendChoice::Only(strata::BackendKind::Cluster) {
            let warm_pool = match (self.warm_pool, &tier) {
                (Some(pool), _) => pool,
                (None, Some(tier)) => format!("strata-{tier}"),
                (None, None) => {
                    return Err(Error::invalid(
                        "--backend cluster needs --warm-pool NAME (or --tier TIER for the pool strata-TIER)",
                    ))
                }
            };
            Some(ClusterTarget {
                kubeconfig: self.kubeconfig,
                namespace: self.namespace,
                warm_pool,
                inner_cli: self.inner_cli,
                egress_listen: self.egress_listen,
            })
        } else {
            if self.kubeconfig.is_some()
                || self.warm_pool.is_some()
                || self.inner_cli.is_some()
                || self.egress_listen.is_some()
            {
                return Err(Error::invalid(
                    "--kubeconfig, --warm-pool, --inner-cli and --egress-listen are for --backend cluster",
                ));
            }
            None
        };
        Ok(Request {
            cluster,
            backend,
            strictness: match (self.best_effort, &profile) {
                (true, _) => Strictness::BestEffort,
                (false, Some(profile)) => profile.strictness,
                (false, None) => Strictness::Strict,
            },
            tool,
            caps,
            stdin: self.stdin,
            raw_output: self.raw_output,
            result_file: self.result_file,
            audit: self.audit,
            tier,
            risk: match self.risk.as_deref() {
                Some(risk) => Some(risk.parse()?),
                None => profile.as_ref().and_then(|p| p.risk),
            },
            tiers: profile.map(|p| p.tiers).unwrap_or_default(),
            allow_weaker: self.allow_weaker,
            approver: match (self.approver, self.approve_interactive) {
                (Some(program), _) => Some(crate::approve::ApproverChoice::Program(program)),
                (None, true) => Some(crate::approve::ApproverChoice::Terminal),
                (None, false) => None,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use clap::CommandFactory;
    use strata::names::{self, Dialect};

    use super::*;

    /// The long flags of `strata run`, each with its visible aliases.
    fn run_flags() -> BTreeMap<String, Vec<String>> {
        let cli = Cli::command();
        let run = cli.find_subcommand("run").expect("run subcommand");
        run.get_arguments()
            .filter_map(|arg| {
                let long = arg.get_long()?;
                let aliases = arg
                    .get_visible_aliases()
                    .unwrap_or_default()
                    .into_iter()
                    .map(|a| format!("--{a}"))
                    .collect();
                Some((format!("--{long}"), aliases))
            })
            .collect()
    }

    /// The flags are the ones `sandbox_core::names` gives each caps field and run option, and
    /// every flag but the CLI's own switches is one of them.
    #[test]
    fn flags_are_the_names_table() {
        let flags = run_flags();
        let mut named = Vec::new();
        let rows = names::CAPS
            .iter()
            .map(|n| (format!("{:?}", n.field), n.cli, n.aliases))
            .chain(
                names::OPTIONS
                    .iter()
                    .map(|n| (format!("{:?}", n.field), n.cli, n.aliases)),
            );
        for (field, cli, aliases) in rows {
            for flag in cli {
                assert!(flags.contains_key(*flag), "{field}: no flag {flag}");
                named.push(flag.to_string());
            }
            for alias in aliases.iter().filter(|a| a.dialect == Dialect::Cli) {
                let primary = cli.first().expect("an alias of a flag");
                assert!(
                    flags[*primary].contains(&alias.name.to_string()),
                    "{field}: {} is not an alias of {primary}",
                    alias.name
                );
            }
        }
        // Switches of the CLI itself, not caps or run options.
        let own = [
            "--script",
            "--raw-output",
            "--json",
            "--caps",
            "--result-file",
            "--audit",
            "--tier",
            "--risk",
            "--allow-weaker",
            "--approver",
            "--approve-interactive",
            "--profile",
            // Where --backend cluster runs.
            "--kubeconfig",
            "--namespace",
            "--warm-pool",
            "--inner-cli",
            "--egress-listen",
        ];
        let unnamed: Vec<&String> = flags
            .keys()
            .filter(|f| !named.contains(f) && !own.contains(&f.as_str()))
            .collect();
        assert!(
            unnamed.is_empty(),
            "flags missing from sandbox_core::names: {unnamed:?}"
        );
    }

    fn request(args: &[&str]) -> Result<Request> {
        let cli = Cli::try_parse_from(["strata", "run"].iter().chain(args).chain(&["--", "true"]))
            .map_err(|e| Error::invalid(e.to_string()))?;
        match cli.command {
            Command::Run(run) => run.into_request(),
            Command::Doctor { .. }
            | Command::Audit(_)
            | Command::Mcp(_)
            | Command::Serve(_)
            | Command::Kube(_)
            | Command::Live(_) => Err(Error::invalid("not run")),
        }
    }

    #[test]
    fn egress_budget_flags_set_the_limits() {
        let caps = request(&["--egress-bytes", "100M", "--egress-connections", "8"])
            .expect("egress flags")
            .caps;
        assert_eq!(caps.limits.egress_bytes, ByteSize::mib(100));
        assert_eq!(caps.limits.egress_connections, 8);
        let defaults = request(&[]).expect("no flags").caps;
        assert_eq!(defaults.limits.egress_bytes, ByteSize::gib(1));
        assert_eq!(defaults.limits.egress_connections, 1024);
        let err = request(&["--egress-bytes", "lots"])
            .err()
            .expect("a bad size is refused");
        assert!(err.to_string().contains("--egress-bytes"), "{err}");
        assert!(
            request(&["--egress-connections", "-1"]).is_err(),
            "a negative count is refused"
        );
    }

    #[test]
    fn secret_flag_parses_name_and_hosts_and_takes_the_value_from_the_environment() {
        // A variable of strata's own environment, named only by this test.
        let path = "s3cr3t-for-the-cli-test";
        std::env::set_var("STRATA_CLI_TEST_SECRET", path);
        let caps = request(&[
            "--net",
            "allow:api.example.com",
            "--secret",
            "STRATA_CLI_TEST_SECRET@api.example.com,*.example.org",
        ])
        .expect("a secret under an allowlist")
        .caps;
        assert_eq!(caps.secrets.len(), 1);
        let secret = &caps.secrets[0];
        assert_eq!(secret.env, "STRATA_CLI_TEST_SECRET");
        assert_eq!(secret.value, path);
        assert_eq!(secret.hosts, ["api.example.com", "*.example.org"]);
        for (binding, expected) in [
            ("PATH", "expected NAME@HOST"),
            ("@api.example.com", "expected NAME@HOST"),
            (
                "STRATA_CLI_UNIT_TEST_UNSET_VARIABLE@api.example.com",
                "set the environment variable STRATA_CLI_UNIT_TEST_UNSET_VARIABLE",
            ),
        ] {
            let err = request(&["--net", "allow:api.example.com", "--secret", binding])
                .err()
                .expect(binding);
            assert_eq!(err.kind(), strata::ErrorKind::InvalidRequest, "{err}");
            assert!(err.to_string().contains(expected), "{binding}: {err}");
        }
        let err = request(&["--secret", "PATH@api.example.com"])
            .err()
            .expect("no allowlist");
        assert!(
            err.to_string().contains("secrets need a network allowlist"),
            "{err}"
        );
        assert!(!err.to_string().contains(path), "{err}");
    }

    #[test]
    fn old_flag_names_still_work() {
        for (new, old) in [("--output", "--max-output"), ("--processes", "--pids")] {
            let a = request(&[new, "64"]).expect(new).caps;
            let b = request(&[old, "64"]).expect(old).caps;
            assert_eq!(a, b, "{old}");
            assert_ne!(a, Caps::new(), "{new} sets something");
        }
        let gvisor = request(&[
            "--backend",
            "container",
            "--image",
            "/i",
            "--runtime",
            "gvisor",
        ])
        .expect("gvisor");
        let runsc = request(&[
            "--backend",
            "container",
            "--image",
            "/i",
            "--runtime",
            "runsc",
        ])
        .expect("runsc");
        assert_eq!(gvisor.caps, runsc.caps);
        let err = request(&[
            "--backend",
            "container",
            "--image",
            "/i",
            "--runtime",
            "lxc",
        ])
        .err()
        .expect("lxc");
        assert!(err.to_string().contains("expected native"), "{err}");
    }
}
