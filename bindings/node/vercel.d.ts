/// <reference types="node" />
/**
 * `strata-sandbox/vercel`: a Strata session in the sandbox shapes of Vercel's JavaScript
 * ecosystem, so code and tools written for them run on Strata unchanged.
 *
 * - {@link StrataSandbox}: the `Sandbox` class of `@vercel/sandbox` (3.x; `sandboxId` as
 *   in 1.x/2.x too): `runCommand` (waiting, or `detached` with `logs()`, `wait()`,
 *   `kill()`), `writeFiles`, `readFile`, `readFileToBuffer`, `downloadFile`, `mkDir`,
 *   `stop`. `bash-tool`'s `createBashTool({ sandbox, destination: sandbox.cwd })` takes
 *   it as a Vercel sandbox.
 * - {@link StrataSandboxSession}: the AI SDK's `Experimental_SandboxSession` (`ai` 7,
 *   `@ai-sdk/provider-utils` 5): `run`, `spawn` (byte streams, `wait()`, `kill()`) and the
 *   file methods. Pass it as `experimental_sandbox` to `generateText`, `streamText` or an
 *   agent; tools receive it in their execute options and description functions.
 *
 * ```ts
 * import { Sandbox } from 'strata-sandbox'
 * import { StrataSandbox, StrataSandboxSession } from 'strata-sandbox/vercel'
 *
 * const sandbox = await StrataSandbox.create({ caps: { timeoutMs: 60_000 } })
 * await sandbox.writeFiles([{ path: 'main.py', content: Buffer.from('print(42)') }])
 * const done = await sandbox.runCommand('python3', ['main.py'])
 * console.log(done.exitCode, await done.stdout())      // 0 '42\n'
 * await generateText({ model, tools, experimental_sandbox: new StrataSandboxSession(sandbox) })
 * await sandbox.stop()
 * ```
 *
 * Paths are guest paths: relative ones resolve against the session's workdir (default
 * `/workspace`), absolute ones must lie inside it, anything else rejects with
 * `InvalidRequestError`. Every command is one sandbox run with the session's caps (their
 * timeout, 30 s by default, applies to detached commands too unless `timeoutMs` says
 * otherwise); files persist between commands until the session is closed.
 *
 * @packageDocumentation
 */

import type { Readable, Writable } from 'node:stream'
import type { Caps, LiveExit, LiveSandbox, PublishedPort, RunResult, Sandbox, Session } from './index.js'

/** The Strata session these classes wrap (`sandbox.session(caps, options)`). */
export type SessionLike = Session

// ---------------------------------------------------------------------------------------
// @vercel/sandbox

/** The signals `kill()` takes: each ends the whole call, every process in it. */
export type Signal = 'SIGHUP' | 'SIGINT' | 'SIGQUIT' | 'SIGKILL' | 'SIGTERM' | number

/** One line of a command's output, as `logs()` yields it. */
export interface LogLine {
  stream: 'stdout' | 'stderr'
  /** The text (UTF-8; a sequence split between chunks is kept whole). */
  data: string
}

/** The parameters of {@link StrataSandbox.runCommand} (as `RunCommandParams` of @vercel/sandbox). */
export interface RunCommandParams {
  /** The program: a path in the sandbox or a name looked up in `PATH`. Never a shell line. */
  cmd: string
  args?: string[]
  /** Working directory (a guest path; relative ones resolve against the workdir). Default: the workdir. */
  cwd?: string
  /** Variables added to the caps' environment for this command. */
  env?: Record<string, string>
  /** Refused when `true`: commands in a Strata sandbox run unprivileged. */
  sudo?: boolean
  /** Resolve at once with a running {@link Command} instead of waiting for the end. */
  detached?: boolean
  /** Gets the standard output as it comes (text). */
  stdout?: Writable
  /** Gets the standard error as it comes (text). */
  stderr?: Writable
  /** Cancels the call: everything in it is killed, and it rejects with a `CancelledError`. */
  signal?: AbortSignal
  /** Timeout in milliseconds instead of the caps' (0: none). */
  timeoutMs?: number
}

/**
 * A command started in a {@link StrataSandbox}. A detached one is running: `exitCode` is
 * `null` until it ends. Made by {@link StrataSandbox.runCommand}, never directly.
 */
export declare class Command {
  protected constructor()
  /** The exit code once it ended (a signal or limit: 128 + the signal, 124 for the timeout; kill(): 128 + its signal), else `null`. */
  readonly exitCode: number | null
  /** How long the sandboxed run took, once it ended by itself. */
  readonly durationMs: number | undefined
  readonly cmdId: string
  /** Its working directory (a guest path). */
  readonly cwd: string
  /** When it started, in milliseconds since the epoch. */
  readonly startedAt: number
  /**
   * Strata's result once it ended by itself: the run's on a session, the process's exit
   * and its output on a live sandbox; `null` while running or after kill() on a session.
   */
  readonly result: RunResult | LiveCommandResult | null
  /**
   * The output, from the start of the command (every call replays it), live until it
   * ends. `close()` ends the iteration; `signal` stops it with the signal's reason.
   */
  logs(opts?: { signal?: AbortSignal }): AsyncGenerator<LogLine, void, void> & Disposable & { close(): void }
  /**
   * Resolves when it ends: by itself, by kill() or by the sandbox's stop(). Rejects when
   * the call failed (refused, or cancelled through runCommand's `signal`). `signal` only
   * stops waiting.
   */
  wait(params?: { signal?: AbortSignal }): Promise<CommandFinished>
  /** The output of one stream, or both in the order it came, once it ended. */
  output(stream?: 'stdout' | 'stderr' | 'both', opts?: { signal?: AbortSignal }): Promise<string>
  stdout(opts?: { signal?: AbortSignal }): Promise<string>
  stderr(opts?: { signal?: AbortSignal }): Promise<string>
  /**
   * Ends the command, every process of its call whatever the signal (default
   * `'SIGTERM'`); wait() then gives 128 + the signal's number. Resolves when all of it is
   * gone; a no-op once it ended. `SIGSTOP`/`SIGCONT` are refused.
   */
  kill(signal?: Signal, opts?: { abortSignal?: AbortSignal }): Promise<void>
}

/** How a command of a live sandbox ended, with its output decoded as UTF-8. */
export interface LiveCommandResult extends LiveExit {
  durationMs: number
  stdout: string
  stderr: string
}

/** A command that has ended. */
export declare class CommandFinished extends Command {
  private constructor()
  readonly exitCode: number
  /** @deprecated It has ended already: resolves with itself. */
  wait(): Promise<CommandFinished>
}

/** Parameters of {@link StrataSandbox.create}. */
export interface CreateParams {
  /** The Strata sandbox whose session this is. Default: `new Sandbox()`. */
  sandbox?: Sandbox
  /** The session's caps (every command runs with them). Default: `{}`. */
  caps?: Caps | null
  /** Where the session's directory is mounted, and the working directory. Default `/workspace`. */
  workdir?: string
  /** Cap of one file transfer (a session only). Default 256 MiB. */
  maxTransfer?: number | string
  signal?: AbortSignal
  /**
   * `true`: one live sandbox for the StrataSandbox's whole life (as a Vercel sandbox is):
   * detached commands keep running between commands, kill() signals that command only,
   * files stay where commands write them. Its workdir, as a session's, is a private host
   * directory (0700) mounted read-write at `workdir` (default `/workspace`) and removed at
   * stop(), unless the caps name a workdir of their own (then that one, and nothing is
   * made). Default `false`: a session, each command a sandbox run of its own.
   */
  live?: boolean
  /** Live only: TCP ports inside to publish on host loopback; {@link StrataSandbox.domain} gives their URLs. */
  ports?: number[]
  /** Live only: the sandbox's lifetime in milliseconds (rounded up to seconds); it ends then. Default: until stop(). */
  timeout?: number
}

/**
 * A Strata session as the `Sandbox` of `@vercel/sandbox`. Commands are argv, never shell
 * lines; each is one sandbox run in the session's workdir with its caps.
 */
export declare class StrataSandbox {
  /** Wraps a session (`caps`: what it was made with, for descriptions). */
  constructor(session: SessionLike, options?: { caps?: Caps | null })
  /**
   * Wraps a live sandbox: `workdir` (default the caps' workdir, else `/tmp`) and `ports`,
   * what it published (for {@link StrataSandbox.domain}).
   */
  constructor(live: LiveSandbox, options?: { caps?: Caps | null; workdir?: string; ports?: PublishedPort[] })
  /** A new session, wrapped. `await using` stops it at the end of the block. */
  static create(params?: CreateParams): Promise<StrataSandbox & AsyncDisposable>
  /** The session (`undefined` when it wraps a live sandbox). */
  readonly session: SessionLike
  /** The live sandbox it wraps, else `null`. */
  readonly live: LiveSandbox | null
  readonly caps: Caps | null
  /** The session id (`@vercel/sandbox` 1.x/2.x name; what bash-tool looks for). */
  readonly sandboxId: string
  /** The session id (`@vercel/sandbox` 3.x name). */
  readonly name: string
  /** The session's workdir: commands' working directory and base of relative paths. */
  readonly cwd: string
  readonly status: 'running' | 'stopped'
  /** Runs `command` with `args` to its end. A non-zero exit is data, not an error. */
  runCommand(command: string, args?: string[], opts?: { signal?: AbortSignal; timeoutMs?: number }): Promise<CommandFinished>
  /** Starts a command and resolves at once with it running. */
  runCommand(params: RunCommandParams & { detached: true }): Promise<Command>
  /** Runs a command to its end. */
  runCommand(params: RunCommandParams): Promise<CommandFinished>
  /** A running command of this sandbox; rejects for an unknown or ended one. */
  getCommand(cmdId: string, opts?: { signal?: AbortSignal }): Promise<Command>
  /** Creates a directory and its missing parents (`mkdir -p`, in the sandbox). */
  mkDir(path: string, opts?: { signal?: AbortSignal }): Promise<void>
  /** The file as a Node.js stream, or `null` when it does not exist. */
  readFile(file: { path: string; cwd?: string }, opts?: { signal?: AbortSignal }): Promise<Readable | null>
  /** The file's bytes, or `null` when it does not exist. */
  readFileToBuffer(file: { path: string; cwd?: string }, opts?: { signal?: AbortSignal }): Promise<Buffer | null>
  /** Copies a file to the host; resolves with the host path, or `null` when the file does not exist. */
  downloadFile(
    src: { path: string; cwd?: string },
    dst: { path: string; cwd?: string },
    opts?: { mkdirRecursive?: boolean; signal?: AbortSignal },
  ): Promise<string | null>
  /** Writes files (parents created, existing files replaced); `mode` is applied with chmod in the sandbox. */
  writeFiles(files: { path: string; content: string | Uint8Array; mode?: number }[], opts?: { signal?: AbortSignal }): Promise<void>
  /**
   * A live sandbox's published port as `http://127.0.0.1:HOSTPORT`; throws for a port not
   * published at create, and always for a session (it accepts no inbound connections).
   */
  domain(port: number): string
  /** Kills running commands and closes the session (its files are removed). Idempotent. */
  stop(opts?: { signal?: AbortSignal }): Promise<void>
}

// ---------------------------------------------------------------------------------------
// The AI SDK's Experimental_SandboxSession (ai 7)

/** Options of {@link StrataSandboxSession.run} and {@link StrataSandboxSession.spawn}. */
export interface SandboxProcessOptions {
  /** A bash command line (`bash -c`). */
  command: string
  /** Working directory; relative ones resolve against the workdir. */
  workingDirectory?: string
  /** Variables added to the caps' environment. */
  env?: Record<string, string>
  /** Kills the command. */
  abortSignal?: AbortSignal
}

/** A spawned command (the AI SDK's `Experimental_SandboxProcess`). */
export interface SandboxProcess {
  readonly pid?: number
  /** Its standard output while it runs. */
  readonly stdout: ReadableStream<Uint8Array>
  readonly stderr: ReadableStream<Uint8Array>
  /** Its exit code (after kill(): 137). Rejects with the abort reason when `abortSignal` aborted. */
  wait(): Promise<{ exitCode: number }>
  /** Ends it and everything it started; resolves when they are gone. Idempotent. */
  kill(): Promise<void>
}

export interface PathOptions {
  path: string
  abortSignal?: AbortSignal
}

/** Options of {@link StrataSandboxSession}. */
export interface StrataSandboxSessionOptions {
  /** The environment's description for the model. Default: one made from the session and `caps`. */
  description?: string
  /** The caps the session was made with (for the description). Default: those of a StrataSandbox, else none. */
  caps?: Caps | null
  /** Timeout of each command in milliseconds instead of the caps' (0: none). */
  timeoutMs?: number
  /** The shell of command lines. Default `'bash'`. */
  shell?: string
  /** A live sandbox only: the working directory and base of relative paths. Default: the StrataSandbox's, else `/tmp`. */
  workdir?: string
}

/**
 * A Strata session as the AI SDK's `Experimental_SandboxSession`: hand it to
 * `generateText({ ..., experimental_sandbox })`.
 */
export declare class StrataSandboxSession {
  /**
   * Wraps a session, a StrataSandbox (of a session or a live sandbox), or a LiveSandbox.
   * On a live sandbox every command runs in that one sandbox (background processes keep
   * running between commands) and `spawn({ stdin: true })` gives a `stdin` stream.
   */
  constructor(session: SessionLike | StrataSandbox | LiveSandbox, options?: StrataSandboxSessionOptions)
  /** The session (for a live sandbox, an adapter of it whose `live` is the LiveSandbox). */
  readonly session: SessionLike
  /** What the model should know of the environment (workdir, persistence, network, timeout). */
  readonly description: string
  /** Runs a command line to its end; `abortSignal` kills it (the promise rejects with a `CancelledError`). */
  run(options: SandboxProcessOptions): Promise<{ exitCode: number; stdout: string; stderr: string }>
  /**
   * With `stdin: true`: on a live sandbox, a process with a `stdin` stream (closing it
   * delivers EOF); on a session, refused before anything starts (a Strata call's standard
   * input comes from its caps).
   */
  spawn(options: SandboxProcessOptions & { stdin: true }): Promise<SandboxProcess & { readonly stdin: WritableStream<Uint8Array> }>
  /** Starts a command line: its output streams while it runs. */
  spawn(options: SandboxProcessOptions & { stdin?: false }): Promise<SandboxProcess>
  spawn(options: SandboxProcessOptions & { stdin?: boolean }): Promise<SandboxProcess>
  readFile(options: PathOptions): Promise<ReadableStream<Uint8Array> | null>
  readBinaryFile(options: PathOptions): Promise<Uint8Array | null>
  /** Text in `encoding` (default UTF-8), lines `startLine`..`endLine` (1-based, inclusive) when given. */
  readTextFile(options: PathOptions & { encoding?: string; startLine?: number; endLine?: number }): Promise<string | null>
  writeFile(options: PathOptions & { content: ReadableStream<Uint8Array> }): Promise<void>
  writeBinaryFile(options: PathOptions & { content: Uint8Array }): Promise<void>
  writeTextFile(options: PathOptions & { content: string; encoding?: string }): Promise<void>
  /** Follows symbolic links (inside the sandbox); `null` when nothing is there. */
  stat(options: PathOptions): Promise<{ type: 'file' | 'directory' | 'other'; size: number } | null>
  /** One level, links not followed; `null` when the directory does not exist, rejects for a file. */
  listDirectory(options: PathOptions): Promise<Array<{ name: string; type: 'file' | 'directory' | 'symlink' | 'other' }> | null>
  /** `true` when deleted, `false` when nothing was there; rejects for a directory. */
  deleteFile(options: PathOptions): Promise<boolean>
}
