/// <reference types="node" />
/**
 * strata-sandbox: run AI-agent tools (model-written code and commands) inside sandboxes,
 * from Node.js.
 *
 * ```ts
 * import { Sandbox, Tool } from 'strata-sandbox'
 *
 * const sandbox = new Sandbox()
 * const result = await sandbox.run(Tool.script('python', 'print(6 * 7)'), { timeoutMs: 5000 })
 * console.log(result.exitCode, result.stdout, result.receipt)
 * ```
 *
 * Caps deny by default: a run sees no host files but the read-only system directories a
 * program needs to start, gets no network and an empty environment, and every limit has a
 * safe default. Runs happen on a native thread pool, so `await sandbox.run()` never blocks
 * the event loop.
 *
 * @packageDocumentation
 */

// ---------------------------------------------------------------------------------------
// Sandbox

/** An isolation backend. */
export type BackendKind = 'process' | 'wasm' | 'container' | 'microvm' | 'cluster'

/** Which isolation backend runs a tool: one of them, or `'auto'` to route by tool. */
export type BackendName = 'auto' | BackendKind

/** Options of {@link Sandbox}. Unknown keys are rejected with {@link InvalidRequestError}. */
export interface SandboxOptions {
  /**
   * The backend. Default `'auto'`: WebAssembly modules run on `wasm`, commands and scripts
   * on `process` (Linux namespaces, landlock, seccomp, cgroups). `container` runs the
   * caps' `image`; `microvm` reports itself unavailable until it is built.
   */
  backend?: BackendName
  /**
   * Default `true`: a run whose caps cannot be fully enforced on this host is refused
   * ({@link UnenforceableError}) before anything runs. `false` runs it best-effort and lists
   * each gap in `receipt.gaps`.
   */
  strict?: boolean
  /**
   * Path of the `strata-helper` binary the process backend starts. Default:
   * `$STRATA_HELPER` when set, else the one installed with this package ({@link helperPath}).
   */
  helper?: string
  /**
   * Check every run against this trust tier: `'low'` (read-only paths under `/tmp`, no
   * network), `'medium'` (the home directory, an allowlist, approved programs), `'high'`
   * (anything), or the name of one of {@link SandboxOptions.tiers}. A request beyond it
   * rejects with {@link DeniedError} naming the tier and the capability, unless the
   * {@link SandboxOptions.approver} grants it. Default: no tier.
   */
  tier?: string
  /** Tiers of your own, shaped like {@link tierPreset}'s result. */
  tiers?: Tier[]
  /**
   * Decides requests beyond the tier (may be async): `true` grants one run within 10
   * minutes, `{ ttlMs, runs }` grants that, `false`/`null`/`{ decision: 'deny', reason }`
   * refuses; a throw refuses. No answer within 120 s refuses.
   */
  approver?: (request: ElevationRequest) => Approval | Promise<Approval>
  /** Append every run, refusal and policy decision to this hash-chained JSON-lines log ({@link verifyAudit}). */
  audit?: string
  /** Backends the risk router may choose (default: all). */
  routeBackends?: BackendName[]
  /** Let the router use a backend below a risk's floor; the receipt then says so. Default `false`. */
  allowWeaker?: boolean
  /**
   * A profile file (TOML, or JSON for `*.json`; see docs/policy.md): its backend (unless
   * `backend` names one other than `'auto'`), strictness (unless `strict` is given), tiers
   * and tier (unless `tier` is given), and the caps and risk of runs that give none. Its
   * caps are validated against the caps JSON Schema.
   */
  profile?: string
}

/** A trust tier: what runs under it may ask for. */
export interface Tier {
  name: string
  /** Trust order (low 0, medium 1, high 2): delegation only goes to the same or a lower rank. */
  rank: number
  paths: 'any' | { within: string[] }
  writes: boolean
  network: 'none' | 'allowlist' | 'any'
  programs: 'any' | { only: string[] }
  secrets: boolean
}

/**
 * What an approver is asked. Everything in it comes from the agent: escape it before
 * showing it on a terminal.
 */
export interface ElevationRequest {
  agent: string | null
  tier: string
  /** The tool, described briefly (a command's program, a script's language and size, a module's path). */
  tool: string
  /** What the run asks for beyond its tier: `read:PATH`, `write:PATH`, `net:allow`, `net:host`, `program:NAME`, `secrets`. */
  needs: { capability: string; detail: string }[]
  /** The whole command line: a command's argv, or a module's path followed by its arguments. Absent for a script. */
  argv?: string[]
  /** A script's language and whole source, with its length in bytes and SHA-256 (hex). */
  script?: { language: 'python' | 'javascript' | 'sh'; source: string; bytes: number; sha256: string }
  /**
   * The run's caps as the tier checked them (the caps JSON: `mounts` with resolved host paths,
   * `net`, `env`, `secrets` without values, `limits`, ...), without `stdin`.
   */
  caps?: Record<string, unknown>
  /** Bytes of stdin the caps feed the tool (left out of `caps`). */
  stdin_bytes?: number
}

/** An approver's answer. */
export type Approval = boolean | null | undefined | { ttlMs?: number; runs?: number } | { decision: 'deny'; reason?: string }

/** How much harm a tool could do: the risk router's input. */
export type Risk = 'compute' | 'files' | 'build' | 'untrusted'

/** Options of one {@link Sandbox.run}. Unknown keys are rejected with {@link InvalidRequestError}. */
export interface RunOptions {
  /**
   * Aborting it kills the sandbox and everything in it; the promise then rejects with a
   * {@link CancelledError} (`name` `'AbortError'`, `code` `'cancelled'`, `cause` the
   * signal's reason). An already aborted signal rejects at once and nothing runs.
   */
  signal?: AbortSignal
  /**
   * Called with each chunk of standard output while the run goes on, in order, before the
   * promise settles. Chunks are raw bytes (split anywhere, also inside a UTF-8 sequence).
   * If the callback throws, the run is cancelled and the promise rejects with what it threw.
   */
  onStdout?: (chunk: Buffer) => void
  /** Like {@link RunOptions.onStdout}, for standard error. */
  onStderr?: (chunk: Buffer) => void
  /**
   * Default `false`: a run that exits non-zero or hits a limit resolves (it is data). With
   * `true` it rejects with {@link ToolFailedError} or {@link LimitExceededError}, whose
   * `result` holds the {@link RunResult}.
   */
  check?: boolean
  /** Check this run against this tier instead of the sandbox's. */
  tier?: string
  /**
   * The tool's risk: with backend `'auto'` the backend is chosen from it (`untrusted` →
   * microvm, `build` → container, `compute` → wasm), never a weaker one unless the sandbox
   * has `allowWeaker`; `receipt.policy.route` says why.
   */
  risk?: Risk
}

/**
 * Runs tools in sandboxes. Cheap to create; backends start on first use and are reused.
 * Any number of runs may be in flight at once.
 */
export class Sandbox {
  /**
   * @throws {InvalidRequestError} for an unknown backend name or option.
   * @throws {BackendUnavailableError} when the backend is not built into this addon.
   */
  constructor(options?: SandboxOptions)
  /** The backend choice. */
  readonly backend: BackendName
  /** Whether runs whose caps cannot be fully enforced are refused (the default). */
  readonly strict: boolean
  /**
   * Runs `tool` with `caps` (default: `{}`, deny by default) and resolves when the run and
   * everything it started are gone.
   *
   * A run that happened resolves, whatever its exit code: check `exitCode`, `timedOut` and
   * `limit`. The promise rejects with a {@link StrataError} subclass when the run was
   * refused or failed: {@link InvalidRequestError} for bad input (nothing ran),
   * {@link UnenforceableError}, {@link BackendUnavailableError}, {@link SetupFailedError},
   * {@link CancelledError}, {@link InternalError}.
   */
  run(tool: ToolInput, caps?: Caps | null, options?: RunOptions): Promise<RunResult>
  /**
   * Runs `tool` with `caps` plus `workspace`'s staging copy mounted read-write at
   * `options.at` (default: the workspace's source path): the tool sees the source's files
   * and its writes stay in the copy until {@link Workspace.commit}. The tier sees a read of
   * the source. Otherwise as {@link Sandbox.run}.
   */
  runInWorkspace(workspace: Workspace, tool: ToolInput, caps?: Caps | null, options?: RunOptions & { at?: string }): Promise<RunResult>
  /**
   * Opens a {@link Session}: a sandbox whose files live across calls, on any backend. `caps`
   * default to the profile's, else `{}`; `options.workdir` (default the profile's
   * `[session]` workdir, else `/workspace`) is the guest path of its directory and the
   * calls' working directory; `options.maxTransfer` (bytes or a size such as `'256M'`,
   * default 256 MiB) bounds each file copy.
   * @throws {InvalidRequestError} for bad caps or options (nothing is made).
   */
  session(caps?: Caps | null, options?: SessionOptions): Session
  /**
   * Starts a live sandbox: one sandbox that stays up for a task (process backend), owned by
   * this process (it ends with {@link LiveSandbox.stop}, its TTLs, or this process's exit).
   * @throws {InvalidRequestError} for bad caps or options (nothing is started).
   */
  start(caps?: Caps | null, options?: StartOptions): Promise<LiveSandbox>
  /**
   * Starts a live sandbox from a snapshot ({@link LiveSandbox.snapshot}): verified first,
   * its caps admitted under this sandbox's tier, on the snapshot's backend, its files
   * copied in. Caps come from the snapshot.
   * @throws {DeniedError} for a snapshot altered on disk or another user's.
   * @throws {InvalidRequestError} when there is no such snapshot.
   */
  startFrom(snapshot: string, options?: StartOptions & { snapshotDir?: string }): Promise<LiveSandbox>
  /** Revokes every elevation the approver granted so far. */
  revokeElevations(): void
}

/** Options of {@link Sandbox.session}. */
export interface SessionOptions {
  /** Absolute guest path of the session's directory (not `/`). Default `/workspace`. */
  workdir?: string
  /** The most bytes one file copy moves. Default 256 MiB. */
  maxTransfer?: ByteSize
}

/** Options of one {@link Session.run} call. */
export interface SessionRunOptions extends RunOptions {
  /** This call's wall-clock timeout in milliseconds; `0` means none. Default: the caps'. */
  timeoutMs?: number
}

/** What one upload or download moved. */
export interface Transfer {
  files: number
  dirs: number
  bytes: number
}

/** One entry of {@link Session.listFiles}. */
export interface FileEntry {
  /** Guest path (absolute, inside the workdir). */
  path: string
  name: string
  /** Symlinks are listed, never followed. */
  kind: 'file' | 'dir' | 'symlink' | 'other'
  size: number
  /** Permission bits. */
  mode: number
}

/**
 * A sandbox whose files live across calls (see {@link Sandbox.session}). Every
 * {@link Session.run} is one sandbox run with the session's caps plus its private directory
 * mounted read-write at {@link Session.workdir}: processes of a call end with it, files
 * stay. File methods take paths relative to the workdir or absolute inside it; copies never
 * follow symlinks, refuse devices, FIFOs, sockets and hard-linked files on the way out, are
 * byte-exact, and are bounded by `maxTransfer`. Sessions are isolated from each other.
 * {@link Session.close} cancels calls in flight and removes the directory (also when the
 * object is garbage-collected); a closed session rejects with {@link InvalidRequestError}.
 */
export declare class Session {
  private constructor()
  /** `s-` and 32 hex digits (128 random bits). */
  readonly id: string
  /** Guest path of the session's directory. */
  readonly workdir: string
  readonly closed: boolean
  /** Runs `tool` in the session; resolves as {@link Sandbox.run} does. */
  run(tool: ToolInput, options?: SessionRunOptions): Promise<RunResult>
  /** Writes `data` (strings as UTF-8) to `path`, replacing a file there; creates directories. */
  writeFile(path: string, data: Buffer | Uint8Array | string): Promise<void>
  /** The bytes of the regular file at `path`. */
  readFile(path: string): Promise<Buffer>
  /** Copies the host file or directory `hostPath` to `path` (merged into a directory there). */
  upload(hostPath: string, path: string): Promise<Transfer>
  /** Copies `path` to the host path `hostPath`, which must not exist. */
  download(path: string, hostPath: string): Promise<Transfer>
  /** The entries of the directory at `path` (default the workdir), sorted by name. */
  listFiles(path?: string): Promise<FileEntry[]>
  /** Removes the file, symlink or directory tree at `path`. */
  remove(path: string): Promise<void>
  /** Cancels the calls in flight and removes the session's directory. Idempotent. */
  close(): Promise<void>
}

/** Options of {@link Sandbox.start}. */
export interface StartOptions {
  /** End the sandbox this many seconds after it started. Default: none. */
  ttl?: number
  /** End it after this many seconds without a request. Default: none. */
  idleTtl?: number
  /**
   * Freeze it after this many seconds without a request or a connection to a published
   * port; the next exec, file operation, followed output or connection resumes it.
   * Default: none.
   */
  idlePause?: number
  /** A name to attach by, besides its id. */
  name?: string
  /** TCP ports inside to publish on host loopback (a free host port each). */
  publish?: number[]
  /** The `strata-live` binary. Default: `$STRATA_LIVE`, else the package's `bin/strata-live`. */
  supervisor?: string
  /** The state directory (0700). Default: `$STRATA_STATE_DIR`, `$XDG_RUNTIME_DIR/strata`, ... */
  stateDir?: string
}

/** Options of {@link LiveSandbox.exec}. */
export interface LiveExecOptions {
  /** Variables on top of the sandbox's environment. */
  env?: Record<string, string>
  /** Working directory inside the sandbox. */
  workdir?: string
  /** Seconds after which its process group is killed (`timedOut`). */
  timeout?: number
  /** Bytes written to its stdin, which is then closed. */
  stdin?: Buffer | Uint8Array | string
  /** Aborting kills the process (the Promise rejects with CancelledError). */
  signal?: AbortSignal
}

/** Options of {@link LiveSandbox.spawn}. */
export interface LiveSpawnOptions {
  env?: Record<string, string>
  workdir?: string
  timeout?: number
  /** Keep its stdin open for {@link LiveSandbox.writeStdin}. */
  stdin?: boolean
  /** Run it on a terminal of this size (output is one stream). */
  tty?: { rows: number; cols: number }
}

/** How a process of a live sandbox ended. */
export interface LiveExit {
  pid: number
  exitCode: number | null
  signal: number | null
  timedOut: boolean
}

/** A foreground exec's result. */
export interface LiveExecResult extends LiveExit {
  stdout: Buffer
  stderr: Buffer
}

/** One process of a live sandbox. */
export interface LiveProcess extends LiveExit {
  argv: string[]
  state: 'running' | 'exited'
}

/** A chunk of a process's output. */
export interface LiveOutput {
  stream: 'stdout' | 'stderr'
  data: Buffer
}

/** An entry of {@link LiveSandbox.listDir}. */
export interface LiveEntry {
  name: string
  kind: 'file' | 'dir' | 'symlink' | 'other'
  size: number
  mode: number
}

/** A published port. */
export interface PublishedPort {
  hostIp: string
  hostPort: number
  guestPort: number
}

/**
 * A sandbox that stays up for a task (see {@link Sandbox.start} and docs/live.md): every
 * exec runs in the same sandbox, files stay between execs, spawned processes keep running.
 * File operations never follow a symlink the tool planted. Requests on a stopped sandbox
 * reject with {@link InvalidRequestError}.
 */
export declare class LiveSandbox {
  private constructor()
  /** Reaches the live sandbox `id` (or name) of this user; not owned by the handle. */
  static attach(id: string): Promise<LiveSandbox>
  readonly id: string
  readonly stopped: boolean
  /** What it is now: id, backend, receipt, clocks, paused, ports, cpu_us. */
  info(): Promise<Record<string, unknown>>
  /**
   * Snapshots it into the snapshot store (`snapshotDir`, default `$STRATA_SNAPSHOT_DIR` or
   * `~/.local/share/strata/snapshots`) under `name` (default: the snapshot's id). On the
   * process and container backends it carries the sandbox's own files, caps and policy.
   */
  snapshot(options?: { name?: string; snapshotDir?: string }): Promise<SnapshotInfo>
  /** Starts `count` (1-100) copies, each with its own copy of the files; owned by this process. */
  fork(count?: number, options?: { ttl?: number; idleTtl?: number; snapshotDir?: string }): Promise<LiveSandbox[]>
  exec(argv: readonly string[], options?: LiveExecOptions): Promise<LiveExecResult>
  /** Starts `argv` in the background; resolves to its pid. */
  spawn(argv: readonly string[], options?: LiveSpawnOptions): Promise<number>
  ps(): Promise<LiveProcess[]>
  /** Kept output, then live output until the process exits. */
  output(pid: number, options?: { signal?: AbortSignal }): AsyncGenerator<LiveOutput, void, undefined>
  /** The output kept so far (the last 1 MiB), stdout and stderr as written. */
  logs(pid: number): Promise<Buffer>
  wait(pid: number): Promise<LiveExit>
  kill(pid: number, signal?: number): Promise<void>
  writeStdin(pid: number, data: Buffer | Uint8Array | string): Promise<void>
  closeStdin(pid: number): Promise<void>
  resize(pid: number, rows: number, cols: number): Promise<void>
  /** Freezes every process; resolves to how (`freezer`, else `signals`; `vm` on a microVM: its vCPUs stop). */
  pause(): Promise<'freezer' | 'signals' | 'vm'>
  resume(): Promise<void>
  /** Publishes the TCP port `guestPort` inside on the host (loopback, a free port by default). */
  publish(guestPort: number, options?: { hostPort?: number; hostIp?: string }): Promise<PublishedPort>
  readFile(path: string): Promise<Buffer>
  writeFile(path: string, data: Buffer | Uint8Array | string): Promise<void>
  listDir(path: string): Promise<LiveEntry[]>
  stat(path: string): Promise<LiveEntry>
  mkdir(path: string, options?: { parents?: boolean }): Promise<void>
  rename(from: string, to: string): Promise<void>
  remove(path: string): Promise<void>
  upload(hostPath: string, path: string): Promise<Transfer>
  download(path: string, hostPath: string): Promise<Transfer>
  /** Ends the sandbox and every process in it; resolves once all of it is gone. */
  stop(): Promise<void>
}

/** A new agent secret (32 random bytes, hex). Keep it secret; share only {@link agentPublicKey}. */
/** What a snapshot is and what it carries. */
export interface SnapshotInfo {
  id: string
  name: string
  backend: string
  /** The sandbox it was taken of. */
  source: string
  /** Seconds since the Unix epoch. */
  createdAt: number
  /** e.g. `files:/tmp`, `caps`, `policy`. */
  carries: string[]
  notCarried: string[]
  files: number
  bytes: number
}

/** The snapshots in the store that verify, oldest first. */
export declare function snapshots(options?: { snapshotDir?: string }): Promise<SnapshotInfo[]>
/** Removes a snapshot, leaving nothing of it. */
export declare function removeSnapshot(name: string, options?: { snapshotDir?: string }): Promise<void>

export declare function generateAgentKey(): string
/** The Ed25519 public key (hex) of an agent secret. */
export declare function agentPublicKey(key: string): string

/** A message as a verifier returns it. */
export interface VerifiedMessage {
  from: string
  to: string
  kind: string
  /** The payload as text (JSON text for structured bodies). */
  body: string
  timestamp_ms: number
  nonce: string
  delegated_tier?: string
  scheme: 'ed25519' | 'hmac-sha256'
  sender_tier: string
  /** For `delegate` messages: the tier the task runs under (never above the delegate's nor the delegator's). */
  delegation: { delegator: string; delegate: string; tier: string; rank: number } | null
}

/**
 * The agents one party knows: names, tiers (`low` 0, `medium` 1, `high` 2, or defined with
 * {@link AgentDirectory.defineTier}), keys, and whom each may message. Messages are signed
 * over every field (Ed25519, or HMAC-SHA256 with a per-pair key).
 */
export declare class AgentDirectory {
  constructor()
  defineTier(name: string, rank: number): void
  /** Adds an agent with its secret `key` (to sign, or verify HMAC) or only its `publicKey` (to verify Ed25519). */
  add(name: string, tier: string, options?: { key?: string; publicKey?: string; mayMessage?: string[] }): void
  /** Signs a message and returns it as JSON text; `delegate` messages need `tier`. */
  sign(sender: string, to: string, kind: string, body: unknown, options?: { tier?: string; scheme?: 'ed25519' | 'hmac-sha256' }): string
  /** A verifier of messages addressed to `me`: timestamps within `windowMs` (default 30 000), each nonce once; with `audit`, every outcome is in that sandbox's audit log. */
  verifier(me: string, options?: { windowMs?: number; audit?: Sandbox }): MessageVerifier
}

/** Checks messages addressed to one agent. */
export declare class MessageVerifier {
  private constructor()
  /** @throws {DeniedError} naming why (bad signature, replayed, stale, from the future, wrong recipient, unknown agent, not permitted). */
  verify(signed: string | object): VerifiedMessage
}

/** One change of a {@link Workspace}. */
export interface WorkspaceChange {
  path: string
  kind: 'added' | 'changed' | 'deleted'
  entry: unknown
  size: number
  mode: number
  /** Why the change needs the caller's explicit acceptance (host-executed path, symlink, set-id bit) or can never be committed (device). */
  flags: unknown[]
}

/**
 * A transactional copy of a host directory: runs write to the copy
 * ({@link Sandbox.runInWorkspace}), {@link Workspace.diff} shows what changed, and
 * {@link Workspace.commit} applies all or part of it, never following a symlink out of the
 * source. `limit` (bytes or `'64M'`; default 64 MiB) caps what a diff may add.
 */
export declare class Workspace {
  constructor(source: string, options?: { limit?: number | string })
  readonly source: string
  /** The staging copy. */
  readonly path: string
  diff(): { changes: WorkspaceChange[]; upper_bytes: number; limit: number; over_limit: boolean }
  /** Flagged changes commit only when their path is in `accept`; with `sandbox` the outcome is audited there. */
  commit(options?: { paths?: string[]; accept?: string[]; allOrNothing?: boolean; sandbox?: Sandbox }): {
    applied: string[]
    refused: { path: string; reason: unknown }[]
    dropped_bits: string[]
    unselected: string[]
  }
  /** Removes the staging copy (idempotent). */
  discard(): void
}

/**
 * The narrowest caps for one tool call: properties of the tool's JSON schema annotated
 * `"x-strata": "read-path" | "write-path" | "host" | "url"` turn the call's arguments into
 * exactly those mounts and allowlist entries, added to `base`. With `tier`, an argument
 * beyond it throws {@link DeniedError} naming the argument.
 */
export declare function capsForCall(
  schema: object,
  args: unknown,
  base?: Caps | null,
  options?: { tier?: 'low' | 'medium' | 'high'; program?: string },
): { caps: Caps; arguments: { pointer: string; annotation: string; capability: string; target: string }[] }

/** Checks an audit log's hash chain; throws {@link InvalidRequestError} naming the first altered, removed or reordered record. */
export declare function verifyAudit(path: string, options?: { head?: string }): { records: number; head: string }
/** A preset tier (`low`, `medium` with `home` or `$HOME`, `high`). */
export declare function tierPreset(name: 'low' | 'medium' | 'high', home?: string): Tier

// ---------------------------------------------------------------------------------------
// Tools

/** Languages of {@link Tool.script}. */
export type ScriptLanguage = 'python' | 'javascript' | 'sh'

/** Execute a program directly (never through a shell). */
export interface CommandTool {
  readonly kind: 'command'
  /** Program and arguments; `argv[0]` is a path in the sandbox or a name looked up in `PATH`. */
  readonly argv: readonly string[]
}

/** Run source code with the backend's interpreter (`python3 -c`, `node -e`, `/bin/sh -c`). */
export interface ScriptTool {
  readonly kind: 'script'
  readonly language: ScriptLanguage
  readonly source: string
}

/** Run a WebAssembly module or component (WASI preview 1 or 2) on the `wasm` backend. */
export interface WasmTool {
  readonly kind: 'wasm'
  /** Host path of the `.wasm` (or `.wat`) file. */
  readonly module: string
  /** Arguments after the program name. */
  readonly args: readonly string[]
}

/** What {@link Sandbox.run} accepts: an argv array (a command) or a tool from {@link Tool}. */
export type ToolInput = readonly string[] | CommandTool | ScriptTool | WasmTool

/** Builders of tools. They only shape data; the request is checked when it runs. */
export declare const Tool: {
  /** A command: `Tool.command(['ls', '-l'])` (same as passing the array itself). */
  command(argv: Iterable<string>): CommandTool
  /** A script: `Tool.script('python', 'print(1)')`. */
  script(language: ScriptLanguage, source: string): ScriptTool
  /** A WebAssembly module with arguments (default none). */
  wasm(module: string, args?: Iterable<string>): WasmTool
}

// ---------------------------------------------------------------------------------------
// Caps

/** A byte count, or a size string with a binary suffix: `'256M'`, `'1.5G'`, `'512K'`. */
export type ByteSize = number | string

/** One allowed network destination: `'example.com'`, `'example.com:443'`, `'*.pypi.org'`. */
export type NetRule = string | { host: string; port?: number }

/**
 * Network policy. Default `'none'` (an empty network namespace). `'host'` shares the host's
 * network (loud opt-in). An allowlist (`'allow:HOST[:PORT],...'`, an array of rules or
 * `{ allow: [...] }`; an empty list denies everything) goes through an egress proxy; a
 * backend that cannot enforce it refuses the run ({@link UnenforceableError}) rather than
 * run unfiltered.
 */
export type Net = 'none' | 'host' | `allow:${string}` | readonly NetRule[] | { allow: readonly NetRule[] }

/** Access to a mount: read-only (`'ro'`) or read-write (`'rw'`). */
export type Access = 'ro' | 'rw'

/** Read-only system directories: `'runtime'` (what host programs need to start) or `'none'`. */
export type SystemDirs = 'runtime' | 'none'

/** A host path made visible in the sandbox. */
export interface Mount {
  /**
   * Absolute host path (file or directory). A symlink in any of its components refuses the
   * run ({@link InvalidRequestError}) unless `followSymlinks` is set.
   */
  host: string
  /** Absolute path inside the sandbox. Default: the same as `host`. */
  guest?: string
  /** `'ro'` (default) or `'rw'`. */
  access?: Access
  /**
   * Follow symlinks in `host` and mount what they lead to (the receipt names it). Default
   * `false`: a symlink, perhaps planted by an earlier run, refuses the grant instead of
   * redirecting it.
   */
  followSymlinks?: boolean
}

/**
 * What a run may touch. Deny by default: every key is optional, and an omitted (or
 * `undefined`/`null`) key keeps its default. Unknown keys are rejected with
 * {@link InvalidRequestError} naming the closest valid key (a typo never drops a
 * restriction). The keys are those of Strata's caps schema (`schema/caps.schema.json`) in
 * camelCase; `docs/caps.md` has the table of every field's name in JSON, Python, Node and
 * the CLI.
 */
export interface Caps {
  /** Host paths visible read-only at the same path. Default: none. */
  readOnly?: string | readonly string[]
  /**
   * Host paths visible read-write at the same path. Default: none. Existing host-executed
   * paths inside them stay read-only (see `protectHostExecuted`).
   */
  readWrite?: string | readonly string[]
  /** Mounts with a different sandbox path, explicit access or `followSymlinks`. Default: none. */
  mounts?: readonly Mount[]
  /**
   * Keep existing host-executed paths inside read-write grants (`.git/hooks`, `.git/config`,
   * `.envrc`, `.vscode`, shell start-up files, ...) read-only, so a tool cannot plant code
   * the host runs later. Default `true`; `false` lets the tool write them (loud opt-out).
   * A tool can still create such a path where none existed.
   */
  protectHostExecuted?: boolean
  /**
   * Read-only system directories. Default `'runtime'` (`/usr`, `/bin`, `/sbin`, `/lib*`,
   * `/etc/ld.so.cache`, `/etc/alternatives`); `'none'` for static binaries.
   */
  system?: SystemDirs
  /** Environment of the tool. Default: empty (never inherited from the host); `PATH`, `HOME=/tmp` and `LANG=C.UTF-8` are added when unset. */
  env?: Record<string, string>
  /** Network policy. Default `'none'`. */
  net?: Net
  /** Standard input. Default: empty. */
  stdin?: string | Uint8Array
  /** Working directory in the sandbox. Default `/tmp` (private, size-capped). */
  workdir?: string
  /** Wall-clock timeout in milliseconds; the whole process tree is killed. Default 30000. */
  timeoutMs?: number
  /** CPU time in milliseconds. Default 30000. */
  cpuTimeMs?: number
  /** Memory limit. Default `'512M'`. */
  memory?: ByteSize
  /** Processes and threads alive at once. Default 128. */
  processes?: number
  /** Bytes kept per output stream; more ends the run with limit `'output'`. Default `'1M'`. */
  output?: ByteSize
  /**
   * The older name of {@link Caps.output}, still accepted (giving both is an error).
   * @deprecated Use `output`.
   */
  maxOutput?: ByteSize
  /** Largest file the tool may write. Default `'64M'`. */
  fileSize?: ByteSize
  /** Open file descriptors. Default 1024. */
  openFiles?: number
  /** Bytes in the private `/tmp` and workdir together. Default `'64M'`. */
  disk?: ByteSize
  /** Address-space limit (`RLIMIT_AS`). Default: none (memory is capped by `memory`). */
  addressSpace?: ByteSize
  /** CPU bandwidth in cores (a cgroup quota; `0.5` is half a core). Default 1. */
  cpus?: number
  /**
   * Under a network allowlist: bytes the run may move through the egress proxy, both
   * directions, all connections together. Past it the connection at hand is closed and later
   * ones are refused (`receipt.network` records a `'budget'` refusal); the run goes on.
   * Default `'1G'`.
   */
  egressBytes?: ByteSize
  /**
   * Under a network allowlist: connections the run may ask the egress proxy for, allowed or
   * refused. Past it they are refused. Default 1024.
   */
  egressConnections?: number
  /**
   * Container backend only: the image, as a local OCI image layout directory, a
   * `docker save`/OCI archive, a root file system directory, or (engine runtimes) an image
   * the engine already has. Images are never pulled. Default: none.
   */
  image?: string
  /** Container backend only: who runs the image. Default `'native'` (no daemon). */
  runtime?: ContainerRuntime
  /**
   * Container backend, native runtime only: a host directory that keeps the container's
   * writable layer between runs. Default: none (every run gets a fresh, size-capped writable
   * layer that is discarded when the run ends).
   */
  workspace?: string
  /**
   * The agent this run acts for: 1 to 64 of `a-z 0-9 _ - .`. With a root embedder each agent
   * gets its own unprivileged host uid and gid (stable across runs); runs without an agent get
   * a fresh one. Default: none.
   */
  agent?: string
  /**
   * Secrets the tool may use only toward named hosts, under a network allowlist (`net`).
   * The tool's variable `env` holds a per-run placeholder (never the value); the egress
   * proxy puts the value in place of the placeholder in the request headers it sends to the
   * secret's `hosts`, and nowhere else (HTTPS through a per-run CA the sandbox trusts). The
   * value is never in the sandbox, receipts or logs. Default: none.
   */
  secrets?: readonly Secret[]
}

/** A secret bound to hosts (see {@link Caps.secrets}). */
export interface Secret {
  /** The tool's environment variable, holding a placeholder: letters, digits and `_`. */
  env: string
  /** The value: printable text, no control characters (it goes into request headers). */
  value: string
  /** Where the value may go: host names or `*.domain` wildcards (no addresses, no ports). */
  hosts: readonly string[]
}

/** The container runtimes: Strata's own, or a Docker/Podman engine (optionally gVisor). */
export type ContainerRuntime = 'native' | 'docker' | 'podman' | 'runsc'

// ---------------------------------------------------------------------------------------
// Results

/**
 * A limit that ended a run, or (`'egress_bytes'`, `'egress_connections'`, in
 * `receipt.network`) an egress budget that refused a connection while the run went on.
 */
export type LimitKind =
  | 'wall'
  | 'cpu'
  | 'memory'
  | 'pids'
  | 'output'
  | 'disk'
  | 'file_size'
  | 'fuel'
  | 'open_files'
  | 'egress_bytes'
  | 'egress_connections'

/** How strictly a run was held to its caps: refused when not enforceable, or best effort. */
export type Strictness = 'strict' | 'best_effort'

/** Where a run's host identity came from. */
export type IdentitySource = 'agent' | 'fresh' | 'embedder'

/** Resources a run used, as far as the backend measures them. */
export interface ResourceUsage {
  /** User CPU time in microseconds. */
  userCpuUs: number
  /** System CPU time in microseconds. */
  systemCpuUs: number
  /** Peak memory in bytes. */
  peakMemoryBytes: number
}

/** What a receipt speaks about. */
export type Capability =
  | 'fs'
  | 'net'
  | 'env'
  | 'processes'
  | 'ipc'
  | 'uts'
  | 'syscalls'
  | 'privileges'
  | 'fds'
  | 'memory'
  | 'cpu'
  | 'wall'
  | 'pids'
  | 'output'
  | 'disk'
  | 'file_size'
  | 'open_files'
  | 'lifetime'

/** The family of mechanism behind an enforced guarantee (`mechanism` names the exact one). */
export type Mechanism =
  | 'namespace'
  | 'landlock'
  | 'seccomp'
  | 'mounts'
  | 'sysctl'
  | 'privileges'
  | 'environment'
  | 'descriptors'
  | 'supervisor'
  | 'cgroup'
  | 'rlimit'
  | 'host'
  | 'tmpfs'
  | 'image'
  | 'runtime'
  | 'wasm'
  | 'proxy'
  | 'vm'
  | 'cluster'

/**
 * Why the egress enforcement refused a connection: no rule admits it or its address is in an
 * always-denied range (`'policy'`), a malformed request (`'bad_request'`), a name that did
 * not resolve (`'unresolvable'`), no allowed address accepted it (`'connect_failed'`), or a
 * budget ran out (`'budget'`, with `limit` naming it).
 */
export type EgressRefusal = 'policy' | 'bad_request' | 'unresolvable' | 'connect_failed' | 'budget'

/** One allow or deny decision of the egress enforcement. */
export interface EgressDecision {
  /** The host as the tool asked for it (possibly invalid, hence refused). */
  host: string
  /** The port as the tool asked for it (0 if it was not a valid port). */
  port: number
  /** The address the decision concerned (resolved and pinned for an allowed name). */
  addr?: string
  /**
   * Whether the connection was allowed (a budget may still cut it later: then a second
   * decision with `refusal: 'budget'` follows).
   */
  allowed: boolean
  /** The rule that allowed it, as written. */
  rule?: string
  /** Why it was refused, by family. */
  refusal?: EgressRefusal
  /** For a budget refusal: which limit. */
  limit?: LimitKind
  /** Why it was refused, for people (names the rule, range or limit). */
  reason?: string
  /** The variables of the secrets whose values went into this request (never the values). */
  secrets?: string[]
}

/** What the egress enforcement of a run under a network allowlist decided. */
export interface NetworkReceipt {
  /**
   * Where the tool reached the egress proxy, as the tool saw it (`'127.0.0.1:3128'`), or the
   * enforcing layer when there is no proxy (`'wasi:sockets'`). Never a credential.
   */
  enforcer: string
  /** The allowlist, as written. */
  rules: string[]
  /** Connection requests the run made (allowed or refused). */
  connections: number
  /** Bytes moved through allowed connections, both directions. */
  bytes: number
  /** Every decision, oldest first (at most 10 000; see `dropped`). */
  decisions: EgressDecision[]
  /** Decisions past the cap, counted but not kept. */
  dropped: number
}

/** What was enforced for one run, per capability and mechanism. */
export interface Receipt {
  /** The backend that ran the tool (the outermost layer). */
  backend: BackendKind
  /** Isolation layers from outermost to innermost. */
  layers: BackendKind[]
  /** The strictness the run used. */
  strictness: Strictness
  /** Every guarantee in force, e.g. `{ capability: 'fs', kind: 'landlock', mechanism: 'landlock ABI 7', detail: '...' }`. */
  enforced: { capability: Capability; kind: Mechanism; mechanism: string; detail: string }[]
  /** Guarantees not enforced; `by_request` marks a relaxation the caller asked for
   * (`net: 'host'`, `protect_host_executed: false`), the only kind a strict run keeps. */
  gaps: { capability: Capability; reason: string; by_request?: boolean }[]
  /** Denials and limit hits observed during the run. */
  denials: { capability: Capability; detail: string }[]
  /**
   * Container runs only: the runtime that ran the tool, the image as given, and its id
   * (`sha256:` digest of its configuration, or `dir:PATH` for a root file system directory).
   */
  container?: { runtime: ContainerRuntime; image: string; digest: string }
  /**
   * The host identity the tool ran as. `source`: `'agent'` (the agent's own ids), `'fresh'`
   * (ids used by this run alone) or `'embedder'` (an unprivileged embedder's own uid).
   * Absent for backends without host identities (wasm).
   */
  identity?: {
    agent?: string
    source: IdentitySource
    host_uid: number
    host_gid: number
    uid: number
    gid: number
  }
  /**
   * Runs under a network allowlist only: every egress decision, with the connections and
   * bytes the run used. Absent otherwise.
   */
  network?: NetworkReceipt
  /** What the policy layer decided: the tier, the route of a declared risk, the elevations used. */
  policy?: {
    tier?: string
    route?: { risk: Risk; declared: boolean; backend: BackendName; reason: string }
    elevations?: { id: number; agent: string | null; capabilities: string[]; expires_at_ms: number; runs_left: number }[]
    /** Grants that followed symlinks under a tier: the tier checked, and the run bound, `resolved`. */
    followed?: { requested: string; resolved: string }[]
  }
}

/** The result of a run that happened. A non-zero exit is data, not an error. */
export interface RunResult {
  /** The exit code, or `null` when a signal or a limit ended the tool. */
  exitCode: number | null
  /** The signal that ended the tool, or `null`. */
  signal: number | null
  /** Whether the wall-clock timeout ended the run (`limit === 'wall'`). */
  timedOut: boolean
  /** The limit that ended the run, or `null`. */
  limit: LimitKind | null
  /** Whether the tool exited with code 0. */
  success: boolean
  /** How the run ended, as text: `'exit code 0'`, `'wall limit exceeded'`, ... */
  status: string
  /** Captured standard output (at most `output` bytes), decoded as UTF-8; invalid bytes become U+FFFD. */
  stdout: string
  /** Captured standard error, like `stdout`. */
  stderr: string
  /** Whether stdout was cut at the output limit. */
  stdoutTruncated: boolean
  /** Whether stderr was cut at the output limit. */
  stderrTruncated: boolean
  /** Wall time of the sandboxed run in milliseconds, from sandbox start to its end. */
  durationMs: number
  /**
   * Wall time of the native `Sandbox::run_with` call in milliseconds (setup, run and
   * teardown). What `await sandbox.run()` takes beyond it is this binding's overhead.
   */
  nativeMs: number
  /** Measured resource usage. */
  usage: ResourceUsage
  /** What was enforced, and what was denied. */
  receipt: Receipt
}

/** Probes this host: which backends and guarantees are available here, and why not. */
export declare function doctor(options?: { helper?: string }): DoctorReport

/** The result of {@link doctor}. */
export interface DoctorReport {
  backends: {
    backend: BackendKind
    /** Whether it can run tools here with its full guarantees. */
    available: boolean
    /** Why not, when unavailable. */
    reason: string | null
    /** Each probed fact it relies on. */
    checks: { name: string; ok: boolean; detail: string }[]
  }[]
}

/** The version of the native addon. */
export declare const version: string

/** Path of the `strata-helper` binary installed with this package (used unless `$STRATA_HELPER` or the `helper` option says otherwise). */
export declare const helperPath: string

// ---------------------------------------------------------------------------------------
// Errors

/** The stable `code` of each error kind. */
export type ErrorCode =
  | 'invalid_request'
  | 'denied'
  | 'backend_unavailable'
  | 'unenforceable'
  | 'limit_exceeded'
  | 'tool_failed'
  | 'cancelled'
  | 'setup_failed'
  | 'internal'

/** Base class of every error Strata raises. Branch on `code` (or `instanceof`). */
export class StrataError extends Error {
  constructor(message: string, code?: ErrorCode, options?: ErrorOptions)
  /** Stable per kind. */
  readonly code: ErrorCode
  /** For `backend_unavailable`: the backend. */
  backend?: string
  /** For `unenforceable`: the guarantee that cannot be enforced (e.g. `'fs: landlock'`). */
  guarantee?: string
  /** For `limit_exceeded`: the limit. */
  limit?: LimitKind
  /** For `setup_failed`: the setup step that failed. */
  stage?: string
  /** For errors of a `check`ed run that ran: its result. */
  result?: RunResult
}

/** `invalid_request`: the request is malformed (bad caps, tool or option). Nothing ran. */
export class InvalidRequestError extends StrataError {
  constructor(message: string, options?: ErrorOptions)
  readonly code: 'invalid_request'
}
/** `denied`: a policy refused the request. Nothing ran. */
export class DeniedError extends StrataError {
  constructor(message: string, options?: ErrorOptions)
  readonly code: 'denied'
}
/** `backend_unavailable`: the backend cannot run on this host or is not built in. Nothing ran. */
export class BackendUnavailableError extends StrataError {
  constructor(message: string, options?: ErrorOptions)
  readonly code: 'backend_unavailable'
}
/** `unenforceable`: a guarantee the caps need cannot be enforced here (strict). Nothing ran. */
export class UnenforceableError extends StrataError {
  constructor(message: string, options?: ErrorOptions)
  readonly code: 'unenforceable'
}
/** `limit_exceeded`: a limit ended a `check`ed run (`result` holds it). */
export class LimitExceededError extends StrataError {
  constructor(message: string, options?: ErrorOptions)
  readonly code: 'limit_exceeded'
}
/** `tool_failed`: a `check`ed run exited non-zero or by a signal (`result` holds it). */
export class ToolFailedError extends StrataError {
  constructor(message: string, options?: ErrorOptions)
  readonly code: 'tool_failed'
}
/**
 * `cancelled`: the run was aborted; everything it started was killed. Its `name` is
 * `'AbortError'`, as frameworks expect of aborted work; `cause` is the signal's reason.
 */
export class CancelledError extends StrataError {
  constructor(message: string, options?: ErrorOptions)
  readonly code: 'cancelled'
}
/** `setup_failed`: building the sandbox failed (`stage` names the step). Nothing of the tool ran. */
export class SetupFailedError extends StrataError {
  constructor(message: string, options?: ErrorOptions)
  readonly code: 'setup_failed'
}
/** `internal`: a bug or an unexpected host failure. */
export class InternalError extends StrataError {
  constructor(message: string, options?: ErrorOptions)
  readonly code: 'internal'
}

// ---------------------------------------------------------------------------------------
// Agent-framework adapters

/** A JSON Schema object (the subset tool schemas use). */
export interface JsonSchema {
  type?: string
  properties?: Record<string, JsonSchema>
  items?: JsonSchema
  required?: string[]
  additionalProperties?: boolean
  minItems?: number
  description?: string
  [key: string]: unknown
}

/** What a sandbox tool returns to the model. */
export interface ToolOutput {
  exitCode: number | null
  signal: number | null
  timedOut: boolean
  limit: LimitKind | null
  stdout: string
  stderr: string
  /** Whether stdout or stderr was cut at the output limit. */
  truncated: boolean
}

/**
 * The generic tool shape, for any framework that takes JSON-Schema tools: OpenAI function
 * calling (`{ type: 'function', function: { name, description, parameters } }`), LangChain
 * (`tool(execute, { name, description, schema: parameters })`), MCP servers, hand-written
 * agent loops.
 */
export interface SandboxTool<Input> {
  /** A tool name a model can call (`run_python`, `run_command`, ...). */
  name: string
  /** What the tool does and what the sandbox allows, written for the model. */
  description: string
  /** The JSON Schema of the input. */
  parameters: JsonSchema
  /**
   * Runs the tool in the sandbox. Resolves with the output whatever the exit code; rejects
   * with a {@link StrataError} (e.g. {@link InvalidRequestError} for a malformed input,
   * {@link CancelledError} when `signal` aborts).
   */
  execute(input: Input, options?: { signal?: AbortSignal }): Promise<ToolOutput>
}

/** Options of {@link codeTool} and {@link commandTool}. */
export interface SandboxToolOptions {
  /** The sandbox to run in. Default: `new Sandbox()`. */
  sandbox?: Sandbox
  /** What every call may touch. Default: `{}` (no files, no network, default limits). */
  caps?: Caps
  /** The tool name. Default: `run_<language>` or `run_command`. */
  name?: string
  /** The description for the model. Default: one naming the language and what the caps allow. */
  description?: string
}

/** Options of {@link codeTool}. */
export interface CodeToolOptions extends SandboxToolOptions {
  /** The language the model writes. Default `'python'`. */
  language?: ScriptLanguage
}

/** A tool that runs model-written code (`{ code }`) in the sandbox. */
export declare function codeTool(options?: CodeToolOptions): SandboxTool<{ code: string }>

/** A tool that runs a command (`{ argv }`, executed without a shell) in the sandbox. */
export declare function commandTool(options?: SandboxToolOptions): SandboxTool<{ argv: string[] }>

/**
 * An input schema the Vercel AI SDK accepts: a Standard Schema with JSON Schema
 * conversion (ai v6+) that is also marked as a `jsonSchema()` schema (ai v5+).
 */
export interface AiSdkInputSchema<Input> {
  readonly '~standard': {
    readonly version: 1
    readonly vendor: string
    readonly validate: (value: unknown) => { readonly value: Input; readonly issues?: undefined }
    readonly types?: { readonly input: unknown; readonly output: Input }
    readonly jsonSchema: {
      readonly input: (options: { readonly target: string }) => Record<string, unknown>
      readonly output: (options: { readonly target: string }) => Record<string, unknown>
    }
  }
  /** The JSON Schema sent to the model. */
  readonly jsonSchema: JsonSchema
}

/** A Vercel AI SDK tool: the object `tool({ description, inputSchema, execute })` of `ai` returns. */
export interface AiSdkTool<Input> {
  description: string
  inputSchema: AiSdkInputSchema<Input>
  /** Runs the tool; the SDK's `abortSignal` kills the sandbox. */
  execute(input: Input, options: { abortSignal?: AbortSignal }): Promise<ToolOutput>
}

/**
 * The Vercel AI SDK form of a sandbox tool, for `generateText({ tools: { python:
 * aiSdkTool(codeTool()) } })`. Needs nothing from `ai` at run time.
 */
export declare function aiSdkTool<Input>(tool: SandboxTool<Input>): AiSdkTool<Input>
