'use strict'
// strata-sandbox: run AI-agent tools in sandboxes from Node.js.
//
// A thin layer over the native addon (crate `strata-node`): it shapes arguments and
// results, turns native errors into Error subclasses with a stable `code`, wires
// AbortSignal and the streaming callbacks, and finds the packaged helper binary. Every
// sandbox decision (validation, routing, enforcement) is made in Rust. Types and docs:
// index.d.ts.

const fs = require('node:fs')
const path = require('node:path')
const nodePath = path
const { addonPath, helperPath, supervisorPath, platformPackage } = require('./platform.js')

let native
try {
  native = require(addonPath)
} catch (error) {
  const hint = fs.existsSync(addonPath)
    ? 'it exists but does not load'
    : `it comes from the prebuilt package ${platformPackage} (an optional dependency: reinstall without --no-optional / --omit=optional), or from a source build in a Strata checkout: npm rebuild strata-sandbox (needs Rust's cargo)`
  throw new Error(`strata-sandbox: cannot load the native addon ${addonPath}: ${error.message} (${hint})`, {
    cause: error,
  })
}

// ---------------------------------------------------------------------------------------
// Errors

/** Base class of every error Strata raises; `code` is stable per kind. */
class StrataError extends Error {
  constructor(message, code = 'internal', options) {
    super(message, options)
    this.code = code
  }
}

function errorClass(name, code, base = StrataError) {
  const cls = {
    [name]: class extends base {
      constructor(message, options) {
        super(message, code, options)
      }
    },
  }[name]
  Object.defineProperty(cls.prototype, 'name', { value: name, writable: true, configurable: true })
  return cls
}

StrataError.prototype.name = 'StrataError'
const InvalidRequestError = errorClass('InvalidRequestError', 'invalid_request')
const DeniedError = errorClass('DeniedError', 'denied')
const BackendUnavailableError = errorClass('BackendUnavailableError', 'backend_unavailable')
const UnenforceableError = errorClass('UnenforceableError', 'unenforceable')
const LimitExceededError = errorClass('LimitExceededError', 'limit_exceeded')
const ToolFailedError = errorClass('ToolFailedError', 'tool_failed')
const CancelledError = errorClass('CancelledError', 'cancelled')
// Frameworks recognise aborted work by `error.name === 'AbortError'`.
Object.defineProperty(CancelledError.prototype, 'name', { value: 'AbortError', writable: true, configurable: true })
const SetupFailedError = errorClass('SetupFailedError', 'setup_failed')
const InternalError = errorClass('InternalError', 'internal')

const ERROR_CLASSES = {
  invalid_request: InvalidRequestError,
  denied: DeniedError,
  backend_unavailable: BackendUnavailableError,
  unenforceable: UnenforceableError,
  limit_exceeded: LimitExceededError,
  tool_failed: ToolFailedError,
  cancelled: CancelledError,
  setup_failed: SetupFailedError,
  internal: InternalError,
}

/** The error for a native `{ code, message, ... }`, with the run's result when there is one. */
function fromNative(e, result) {
  const Cls = ERROR_CLASSES[e.code] ?? StrataError
  const error = Cls === StrataError ? new StrataError(e.message, e.code) : new Cls(e.message)
  for (const key of ['backend', 'guarantee', 'limit', 'stage']) {
    if (e[key] != null) error[key] = e[key]
  }
  if (result !== undefined) error.result = result
  return error
}

/** An argument the native layer refused to convert (wrong JavaScript type). */
function fromConversion(error) {
  return error instanceof StrataError ? error : new InvalidRequestError(error.message, { cause: error })
}

function abortError(signal) {
  return new CancelledError('run cancelled by its AbortSignal; the sandbox was killed', { cause: signal.reason })
}

// ---------------------------------------------------------------------------------------
// Tools

/** Builders of the tools `Sandbox.run` accepts (an argv array works too). */
const Tool = Object.freeze({
  command(argv) {
    return { kind: 'command', argv: Array.from(argv) }
  },
  script(language, source) {
    return { kind: 'script', language, source }
  },
  wasm(module, args = []) {
    return { kind: 'wasm', module, args: Array.from(args) }
  },
})

// ---------------------------------------------------------------------------------------
// Sandbox

const SANDBOX_OPTIONS = new Set([
  'backend',
  'strict',
  'helper',
  'tier',
  'tiers',
  'approver',
  'audit',
  'routeBackends',
  'allowWeaker',
  'profile',
])
const RUN_OPTIONS = new Set(['signal', 'onStdout', 'onStderr', 'check', 'tier', 'risk'])
const WORKSPACE_RUN_OPTIONS = new Set([...RUN_OPTIONS, 'at'])
const SESSION_RUN_OPTIONS = new Set([...RUN_OPTIONS, 'timeoutMs'])
const START = Symbol('start')
/** The native object behind a public one (a module-private key). */
const NATIVE = Symbol('native')

/** `value` when it is not a native error, else throws it as its Error subclass. */
function unwrap(value) {
  if (value !== null && typeof value === 'object' && typeof value.code === 'string' && typeof value.message === 'string') {
    throw fromNative(value)
  }
  return value
}

/** An approver's answer as the native side reads it. */
function approvalJson(answer) {
  if (answer === true) return JSON.stringify({ decision: 'grant' })
  if (answer === false || answer == null) return JSON.stringify({ decision: 'deny', reason: 'the approver refused' })
  if (typeof answer !== 'object') {
    return JSON.stringify({ decision: 'deny', reason: 'the approver must return a boolean, null or an object' })
  }
  if (answer.decision === 'deny') return JSON.stringify({ decision: 'deny', reason: String(answer.reason ?? '') })
  const grant = { decision: 'grant' }
  if (answer.ttlMs !== undefined) grant.ttl = answer.ttlMs
  if (answer.runs !== undefined) grant.runs = answer.runs
  return JSON.stringify(grant)
}

/** The native approver: calls the user's (possibly async) function and answers by id. */
function approverBridge(approver) {
  return (id, requestJson) => {
    const answer = (json) => native.answerElevation(id, json)
    Promise.resolve()
      .then(() => approver(JSON.parse(requestJson)))
      .then(
        (decision) => answer(approvalJson(decision)),
        (error) => answer(JSON.stringify({ decision: 'deny', reason: `the approver threw ${error?.message ?? error}` })),
      )
  }
}
const NO_OPTIONS = Object.freeze({})
// The native callback's event kinds, and the bits of the native run's flags.
const STDOUT = 0
const STDERR = 1
const RUN_STDOUT = 1
const RUN_STDERR = 2
const RUN_CHECK = 4

function checkKeys(object, allowed, what) {
  if (object === undefined || object === null) return NO_OPTIONS
  if (typeof object !== 'object') throw new InvalidRequestError(`${what} must be an object`)
  for (const key in object) {
    if (!allowed.has(key)) {
      throw new InvalidRequestError(`unknown ${what} key ${JSON.stringify(key)} (expected one of ${[...allowed].join(', ')})`)
    }
  }
  return object
}

// The receipt (a few KiB as JSON) stays in Rust until first read: most callers never look.
// Every result gets the same accessor functions (the native receipt under a symbol), so all
// results share one object shape: closures per result would turn each into a slow
// dictionary-mode object.
const NATIVE_RECEIPT = Symbol('strata.nativeReceipt')
const RECEIPT_ACCESSOR = {
  enumerable: true,
  configurable: true,
  get() {
    const receipt = JSON.parse(native.receiptJson(this[NATIVE_RECEIPT]))
    Object.defineProperty(this, 'receipt', { value: receipt, enumerable: true, writable: true, configurable: true })
    return receipt
  },
  set(value) {
    Object.defineProperty(this, 'receipt', { value, enumerable: true, writable: true, configurable: true })
  },
}

/** The public result of a run, from the native callback's arguments (see onEvent). */
function toResult(
  exitCode,
  signal,
  timedOut,
  limit,
  status,
  stdout,
  stderr,
  stdoutTruncated,
  stderrTruncated,
  durationMs,
  nativeMs,
  userCpuUs,
  systemCpuUs,
  peakMemoryBytes,
  receipt,
) {
  const result = {
    exitCode: exitCode ?? null,
    signal: signal ?? null,
    timedOut,
    limit: limit ?? null,
    success: exitCode === 0,
    status,
    stdout,
    stdoutTruncated,
    stderr,
    stderrTruncated,
    durationMs,
    nativeMs,
    usage: { userCpuUs, systemCpuUs, peakMemoryBytes },
  }
  Object.defineProperty(result, NATIVE_RECEIPT, { value: receipt, configurable: true })
  Object.defineProperty(result, 'receipt', RECEIPT_ACCESSOR)
  return result
}

// One 'abort' listener per signal however many runs share it (agent frameworks pass one
// signal to every tool call), removed when its last run ends.
const watchedSignals = new WeakMap()

/** Cancels `cancel` when `signal` aborts; returns the function that stops watching. */
function watchSignal(signal, cancel) {
  let watch = watchedSignals.get(signal)
  if (!watch) {
    const runs = new Set()
    const onAbort = () => {
      for (const run of runs) run.cancel()
    }
    watch = { runs, onAbort }
    watchedSignals.set(signal, watch)
    signal.addEventListener('abort', onAbort)
  }
  watch.runs.add(cancel)
  return () => {
    watch.runs.delete(cancel)
    if (watch.runs.size === 0 && watchedSignals.get(signal) === watch) {
      watchedSignals.delete(signal)
      signal.removeEventListener('abort', watch.onAbort)
    }
  }
}

// $STRATA_HELPER, then the packaged copy (the rule lives in Rust); undefined when neither
// is there, so the library's own search and error apply.
function defaultHelper() {
  return native.packagedHelper(path.dirname(helperPath)) ?? undefined
}

/** Runs tools in sandboxes. See index.d.ts. */
class Sandbox {
  #native

  constructor(options) {
    const opts = checkKeys(options, SANDBOX_OPTIONS, 'Sandbox option')
    const bad =
      (opts.backend !== undefined && typeof opts.backend !== 'string' && 'backend must be a string') ||
      (opts.strict !== undefined && typeof opts.strict !== 'boolean' && 'strict must be a boolean') ||
      (opts.helper !== undefined && typeof opts.helper !== 'string' && 'helper must be a string') ||
      (opts.tier !== undefined && typeof opts.tier !== 'string' && 'tier must be a string') ||
      (opts.tiers !== undefined && !Array.isArray(opts.tiers) && 'tiers must be an array of tier objects') ||
      (opts.approver !== undefined && typeof opts.approver !== 'function' && 'approver must be a function') ||
      (opts.audit !== undefined && typeof opts.audit !== 'string' && 'audit must be a path string') ||
      (opts.routeBackends !== undefined && !Array.isArray(opts.routeBackends) && 'routeBackends must be an array') ||
      (opts.allowWeaker !== undefined && typeof opts.allowWeaker !== 'boolean' && 'allowWeaker must be a boolean') ||
      (opts.profile !== undefined && typeof opts.profile !== 'string' && 'profile must be a path string')
    if (bad) throw new InvalidRequestError(bad)
    let made
    try {
      made = native.createSandbox(
        {
          backend: opts.backend,
          strict: opts.strict,
          helper: opts.helper ?? defaultHelper(),
          tier: opts.tier,
          tiersJson: opts.tiers === undefined ? undefined : JSON.stringify(opts.tiers),
          audit: opts.audit,
          routeBackends: opts.routeBackends,
          allowWeaker: opts.allowWeaker,
          profile: opts.profile,
        },
        opts.approver === undefined ? undefined : approverBridge(opts.approver),
      )
    } catch (error) {
      throw fromConversion(error)
    }
    if (!(made instanceof native.NativeSandbox)) throw fromNative(made)
    this.#native = made
  }

  /** The backend choice: `auto`, `process`, `wasm`, `container` or `microvm`. */
  get backend() {
    return this.#native.backend
  }

  /** Whether runs whose caps cannot be fully enforced are refused (the default). */
  get strict() {
    return this.#native.strict
  }

  /** Revokes every elevation the approver granted so far. */
  revokeElevations() {
    this.#native.revokeElevations()
  }

  run(tool, caps, options) {
    return this.#start(tool, caps, options, RUN_OPTIONS, undefined, undefined)
  }

  /**
   * Opens a session: a sandbox whose files live across calls (see index.d.ts). Throws
   * InvalidRequestError for bad caps or options; nothing is made then.
   */
  session(caps, options) {
    const opts = checkKeys(options, new Set(['workdir', 'maxTransfer']), 'session option')
    const bad =
      (opts.workdir !== undefined && typeof opts.workdir !== 'string' && 'workdir must be a path string') ||
      (opts.maxTransfer !== undefined &&
        typeof opts.maxTransfer !== 'number' &&
        typeof opts.maxTransfer !== 'string' &&
        'maxTransfer must be a number of bytes or a size string')
    if (bad) throw new InvalidRequestError(bad)
    let made
    try {
      made = this.#native.openSession(caps, opts.workdir, opts.maxTransfer)
    } catch (error) {
      throw fromConversion(error)
    }
    return new Session(unwrap(made), this)
  }

  /**
   * Starts a live sandbox: one sandbox that stays up for a task (see index.d.ts). Resolves
   * to a LiveSandbox owned by this process; rejects with InvalidRequestError for bad caps or
   * options (nothing is started then).
   */
  async start(caps, options) {
    const json = liveStartJson(checkKeys(options, START_OPTIONS, 'start option'))
    let pending
    try {
      pending = this.#native.startLive(caps, json)
    } catch (error) {
      throw fromConversion(error)
    }
    return new LiveSandbox(unwrap(await pending))
  }

  /**
   * Starts a live sandbox from a snapshot (LiveSandbox.snapshot): verified first (an
   * altered or another user's snapshot rejects with DeniedError), its caps admitted under
   * this sandbox's tier, on the snapshot's backend, with its files copied in.
   */
  async startFrom(snapshot, options) {
    if (typeof snapshot !== 'string') throw new InvalidRequestError('snapshot must be a snapshot name')
    const json = liveStartJson(checkKeys(options, START_FROM_OPTIONS, 'startFrom option'))
    return new LiveSandbox(unwrap(await this.#native.startLiveFrom(snapshot, json)))
  }

  /** Runs a call of `session` (used by Session.run). */
  [START](session, tool, options) {
    return this.#start(tool, undefined, options, SESSION_RUN_OPTIONS, undefined, session)
  }

  /**
   * Runs `tool` with `caps` plus `workspace`'s staging copy mounted read-write at
   * `options.at` (default: the workspace's source path); writes stay in the copy until
   * `workspace.commit()`. The tier sees a read of the source.
   */
  runInWorkspace(workspace, tool, caps, options) {
    if (!(workspace instanceof Workspace)) {
      return Promise.reject(new InvalidRequestError('workspace must be a Workspace'))
    }
    return this.#start(tool, caps, options, WORKSPACE_RUN_OPTIONS, workspace[NATIVE], undefined)
  }

  /** The native sandbox, for the policy helpers of this module. */
  [NATIVE]() {
    return this.#native
  }

  #start(tool, caps, options, allowed, workspace, session) {
    return new Promise((resolve, reject) => {
      let opts
      try {
        opts = checkKeys(options, allowed, 'run option')
      } catch (error) {
        reject(error)
        return
      }
      const { signal, onStdout, onStderr } = opts
      const bad =
        (onStdout !== undefined && typeof onStdout !== 'function' && 'onStdout must be a function') ||
        (onStderr !== undefined && typeof onStderr !== 'function' && 'onStderr must be a function') ||
        (signal != null && typeof signal.addEventListener !== 'function' && 'signal must be an AbortSignal') ||
        (opts.check !== undefined && typeof opts.check !== 'boolean' && 'check must be a boolean') ||
        (opts.tier !== undefined && typeof opts.tier !== 'string' && 'tier must be a string') ||
        (opts.risk !== undefined && typeof opts.risk !== 'string' && 'risk must be a string') ||
        (opts.at !== undefined && typeof opts.at !== 'string' && 'at must be a path string') ||
        (opts.timeoutMs !== undefined &&
          (typeof opts.timeoutMs !== 'number' || !(opts.timeoutMs >= 0) || !Number.isFinite(opts.timeoutMs)) &&
          'timeoutMs must be a non-negative number of milliseconds')
      if (bad) {
        reject(new InvalidRequestError(bad))
        return
      }
      if (signal?.aborted) {
        reject(abortError(signal))
        return
      }
      let cancel
      let unwatch
      let callbackFailed = false
      let callbackError
      if (signal || onStdout || onStderr) cancel = new native.NativeCancel()
      if (signal) unwatch = watchSignal(signal, cancel)
      const deliver = (fn, chunk) => {
        if (callbackFailed) return
        try {
          fn(chunk)
        } catch (error) {
          callbackFailed = true
          callbackError = error
          cancel.cancel()
        }
      }
      // (0 | 1, chunk) for output; then once (2, error) when the run failed before its tool
      // ran, or (2, error, ...parts of the result) when it ran, with `error` set when (with
      // `check`) it did not succeed. Plain values: JavaScript builds objects faster than Rust
      // can through Node-API.
      const onEvent = (kind, payload, ...parts) => {
        if (kind === STDOUT) return deliver(onStdout, payload)
        if (kind === STDERR) return deliver(onStderr, payload)
        if (unwatch) unwatch()
        const result = parts.length === 0 ? undefined : toResult(...parts)
        if (callbackFailed) reject(callbackError)
        else if (payload) {
          if (payload.code === 'cancelled' && signal?.aborted) reject(abortError(signal))
          else reject(fromNative(payload, result))
        } else resolve(result)
      }
      let refused
      try {
        refused = this.#native.run(
          tool,
          caps,
          (onStdout === undefined ? 0 : RUN_STDOUT) |
            (onStderr === undefined ? 0 : RUN_STDERR) |
            (opts.check === true ? RUN_CHECK : 0),
          cancel,
          onEvent,
          opts.tier === undefined && opts.risk === undefined && opts.at === undefined && opts.timeoutMs === undefined
            ? undefined
            : { tier: opts.tier, risk: opts.risk, at: opts.at, timeoutMs: opts.timeoutMs },
          workspace,
          session,
        )
      } catch (error) {
        if (unwatch) unwatch()
        reject(fromConversion(error))
        return
      }
      if (refused) {
        if (unwatch) unwatch()
        reject(fromNative(refused))
      }
    })
  }
}

/** Probes this host: which backends and guarantees are available, and why not. */
function doctor(options) {
  const opts = checkKeys(options, new Set(['helper']), 'doctor option')
  return JSON.parse(native.doctor(opts.helper ?? defaultHelper()))
}

/** A new agent secret (hex). Keep it secret; share only `agentPublicKey(key)`. */
function generateAgentKey() {
  return unwrap(native.generateAgentKey())
}

/** The Ed25519 public key (hex) of an agent secret. */
function agentPublicKey(key) {
  if (typeof key !== 'string') throw new InvalidRequestError('key must be a hex string')
  return unwrap(native.agentPublicKey(key))
}

/** The agents one party knows: names, tiers, keys, and whom each may message. See index.d.ts. */
class AgentDirectory {
  #native = new native.NativeDirectory()

  defineTier(name, rank) {
    unwrap(this.#native.defineTier(String(name), rank) ?? null)
  }

  add(name, tier, options) {
    const opts = checkKeys(options, new Set(['key', 'publicKey', 'mayMessage']), 'agent option')
    unwrap(this.#native.add(String(name), String(tier), opts) ?? null)
  }

  sign(sender, to, kind, body, options) {
    const opts = checkKeys(options, new Set(['tier', 'scheme']), 'sign option')
    const text = typeof body === 'string' ? body : JSON.stringify(body)
    return unwrap(this.#native.sign(String(sender), String(to), String(kind), text, opts.tier, opts.scheme))
  }

  verifier(me, options) {
    const opts = checkKeys(options, new Set(['windowMs', 'audit']), 'verifier option')
    if (opts.audit !== undefined && !(opts.audit instanceof Sandbox)) {
      throw new InvalidRequestError('audit must be a Sandbox')
    }
    return new MessageVerifier(unwrap(this.#native.verifier(String(me), opts.windowMs)), opts.audit)
  }
}

/** Checks messages addressed to one agent. Made by `AgentDirectory.verifier`. */
class MessageVerifier {
  #native
  #audit

  constructor(verifier, audit) {
    if (!(verifier instanceof native.NativeVerifier)) throw new TypeError('use AgentDirectory.verifier()')
    this.#native = verifier
    this.#audit = audit
  }

  verify(signed) {
    const text = typeof signed === 'string' ? signed : JSON.stringify(signed)
    return JSON.parse(unwrap(this.#native.verify(text, this.#audit?.[NATIVE]())))
  }
}

/** The bytes of `data` (a Buffer, another Uint8Array, or a string encoded as UTF-8). */
function bytesOf(data) {
  if (Buffer.isBuffer(data)) return data
  if (data instanceof Uint8Array) return Buffer.from(data.buffer, data.byteOffset, data.byteLength)
  if (typeof data === 'string') return Buffer.from(data, 'utf8')
  throw new InvalidRequestError('data must be a Buffer, a Uint8Array or a string')
}

function pathArg(value, name) {
  if (typeof value !== 'string') throw new InvalidRequestError(`${name} must be a path string`)
  return value
}

/** A sandbox whose files live across calls. Made by `Sandbox.session`; see index.d.ts. */
class Session {
  #native
  #sandbox

  constructor(nativeSession, sandbox) {
    if (!(nativeSession instanceof native.NativeSession)) {
      throw new InvalidRequestError('sessions are opened with sandbox.session(caps)')
    }
    this.#native = nativeSession
    this.#sandbox = sandbox
  }

  get id() {
    return this.#native.id
  }

  get workdir() {
    return this.#native.workdir
  }

  get closed() {
    return this.#native.closed
  }

  run(tool, options) {
    return this.#sandbox[START](this.#native, tool, options)
  }

  async writeFile(path, data) {
    unwrap(await this.#native.writeFile(pathArg(path, 'path'), bytesOf(data)))
  }

  async readFile(path) {
    return unwrap(await this.#native.readFile(pathArg(path, 'path')))
  }

  async upload(hostPath, path) {
    return JSON.parse(unwrap(await this.#native.upload(pathArg(hostPath, 'hostPath'), pathArg(path, 'path'))))
  }

  async download(path, hostPath) {
    return JSON.parse(unwrap(await this.#native.download(pathArg(path, 'path'), pathArg(hostPath, 'hostPath'))))
  }

  async listFiles(path = '.') {
    return JSON.parse(unwrap(await this.#native.listFiles(pathArg(path, 'path'))))
  }

  async remove(path) {
    unwrap(await this.#native.remove(pathArg(path, 'path')))
  }

  async close() {
    unwrap(await this.#native.close())
  }
}

const START_OPTIONS = new Set(['ttl', 'idleTtl', 'idlePause', 'name', 'publish', 'supervisor', 'stateDir'])
const START_FROM_OPTIONS = new Set([...START_OPTIONS, 'snapshotDir'])
const EXEC_OPTIONS = new Set(['env', 'workdir', 'timeout', 'stdin', 'signal'])
const SPAWN_OPTIONS = new Set(['env', 'workdir', 'timeout', 'stdin', 'tty'])

function execArgs(argv, opts) {
  if (!Array.isArray(argv) || !argv.every((a) => typeof a === 'string')) {
    throw new InvalidRequestError('argv must be an array of strings (never a shell string)')
  }
  if (opts.env !== undefined && (typeof opts.env !== 'object' || opts.env === null)) {
    throw new InvalidRequestError('env must be an object of strings')
  }
  if (opts.workdir !== undefined && typeof opts.workdir !== 'string') {
    throw new InvalidRequestError('workdir must be a path string')
  }
  if (opts.timeout !== undefined && !(typeof opts.timeout === 'number' && opts.timeout > 0)) {
    throw new InvalidRequestError('timeout must be a positive number of seconds')
  }
  return {
    argv,
    env: opts.env,
    workdir: opts.workdir,
    timeoutMs: opts.timeout === undefined ? undefined : Math.ceil(opts.timeout * 1000),
  }
}

/** The JSON of `start`'s and `startFrom`'s options, checked (InvalidRequestError names a bad one). */
function liveStartJson(opts) {
  const path = (key) => opts[key] !== undefined && typeof opts[key] !== 'string' && `${key} must be a path string`
  const bad =
    (opts.ttl !== undefined && typeof opts.ttl !== 'number' && 'ttl must be a number of seconds') ||
    (opts.idleTtl !== undefined && typeof opts.idleTtl !== 'number' && 'idleTtl must be a number of seconds') ||
    (opts.idlePause !== undefined && typeof opts.idlePause !== 'number' && 'idlePause must be a number of seconds') ||
    (opts.name !== undefined && typeof opts.name !== 'string' && 'name must be a string') ||
    (opts.publish !== undefined &&
      !(Array.isArray(opts.publish) && opts.publish.every((p) => Number.isInteger(p) && p > 0 && p < 65536)) &&
      'publish must be an array of TCP ports (1-65535)') ||
    path('supervisor') ||
    path('stateDir') ||
    path('snapshotDir')
  if (bad) throw new InvalidRequestError(bad)
  const supervisor =
    opts.supervisor ?? process.env.STRATA_LIVE ?? (fs.existsSync(supervisorPath) ? supervisorPath : undefined)
  return JSON.stringify({
    ttl: opts.ttl,
    idleTtl: opts.idleTtl,
    idlePause: opts.idlePause,
    name: opts.name,
    publish: opts.publish ?? [],
    supervisor,
    stateDir: opts.stateDir,
    snapshotDir: opts.snapshotDir,
  })
}

function liveExit(exit) {
  return { pid: exit.pid, exitCode: exit.exit_code ?? null, signal: exit.signal ?? null, timedOut: exit.timed_out }
}

/** A sandbox that stays up for a task. Made by `Sandbox.start`; see index.d.ts. */
class LiveSandbox {
  #native

  constructor(nativeLive) {
    if (!(nativeLive instanceof native.NativeLive)) {
      throw new InvalidRequestError('live sandboxes are started with sandbox.start(caps) or LiveSandbox.attach(id)')
    }
    this.#native = nativeLive
  }

  /** Reaches the live sandbox `id` (or name) of this user; it is not owned by this handle. */
  static async attach(id) {
    if (typeof id !== 'string') throw new InvalidRequestError('id must be a string')
    return new LiveSandbox(unwrap(await native.attachLive(id)))
  }

  get id() {
    return this.#native.id
  }

  get stopped() {
    return this.#native.stopped
  }

  async #call(op, args, data) {
    return unwrap(await this.#native.call(op, JSON.stringify(args ?? {}), data))
  }

  async #json(op, args, data) {
    return JSON.parse(await this.#call(op, args, data))
  }

  async info() {
    return this.#json('info')
  }

  /**
   * Snapshots the sandbox (its own files, caps and policy on the process and container
   * backends) into the snapshot store; resolves to what the snapshot is and carries.
   */
  async snapshot(options) {
    const opts = checkKeys(options, new Set(['name', 'snapshotDir']), 'snapshot option')
    return snapshotInfo(await this.#json('snapshot', { name: opts.name, snapshotDir: opts.snapshotDir }))
  }

  /** Starts `count` copies (1 to 100) of the sandbox, each owned by this process. */
  async fork(count = 1, options) {
    const opts = checkKeys(options, new Set(['ttl', 'idleTtl', 'snapshotDir']), 'fork option')
    if (!Number.isInteger(count)) throw new InvalidRequestError('count must be an integer (1 to 100)')
    if (count < 1 || count > 100) throw new InvalidRequestError(`fork makes 1 to 100 children, not ${count}`)
    const children = await this.#call('fork', {
      count,
      ttl: opts.ttl,
      idleTtl: opts.idleTtl,
      snapshotDir: opts.snapshotDir,
    })
    return children.map((child) => new LiveSandbox(child))
  }

  async exec(argv, options) {
    const opts = checkKeys(options, EXEC_OPTIONS, 'exec option')
    const args = execArgs(argv, opts)
    const stdin = opts.stdin === undefined ? undefined : bytesOf(opts.stdin)
    if (opts.signal !== undefined) {
      // Cancellable: started detached, killed on abort, output read once it ended.
      if (!(opts.signal instanceof AbortSignal)) throw new InvalidRequestError('signal must be an AbortSignal')
      if (opts.signal.aborted) throw new CancelledError('the exec was aborted before it started')
      const pid = await this.#json('spawn', { ...args, stdin: stdin !== undefined })
      const onAbort = () => this.#call('kill', { pid, signal: 9 }).catch(() => {})
      opts.signal.addEventListener('abort', onAbort)
      try {
        if (stdin !== undefined) {
          await this.#call('writeStdin', { pid }, stdin)
          await this.#call('closeStdin', { pid })
        }
        const exit = await this.#json('wait', { pid })
        const out = { stdout: [], stderr: [] }
        for await (const chunk of this.output(pid)) out[chunk.stream].push(chunk.data)
        if (opts.signal.aborted) throw new CancelledError('the exec was aborted')
        return { ...liveExit(exit), stdout: Buffer.concat(out.stdout), stderr: Buffer.concat(out.stderr) }
      } finally {
        opts.signal.removeEventListener('abort', onAbort)
      }
    }
    const done = await this.#json('exec', { ...args, stdin: stdin !== undefined }, stdin)
    return {
      pid: done.pid,
      exitCode: done.exitCode ?? null,
      signal: done.signal ?? null,
      timedOut: done.timedOut,
      stdout: Buffer.from(done.stdout, 'base64'),
      stderr: Buffer.from(done.stderr, 'base64'),
    }
  }

  async spawn(argv, options) {
    const opts = checkKeys(options, SPAWN_OPTIONS, 'spawn option')
    const args = execArgs(argv, opts)
    if (opts.stdin !== undefined && typeof opts.stdin !== 'boolean') throw new InvalidRequestError('stdin must be a boolean')
    if (opts.tty !== undefined && !(typeof opts.tty === 'object' && opts.tty !== null)) {
      throw new InvalidRequestError('tty must be { rows, cols }')
    }
    return this.#json('spawn', { ...args, stdin: opts.stdin ?? false, tty: opts.tty })
  }

  /** Every process started with exec or spawn. */
  async ps() {
    return (await this.#json('ps')).map((p) => ({
      pid: p.pid,
      argv: p.argv,
      state: p.state,
      exitCode: p.exit_code ?? null,
      signal: p.signal ?? null,
      timedOut: p.timed_out,
    }))
  }

  /**
   * Output of process `pid` as an async iterator of `{ stream, data }`: what is kept, then
   * what it writes, until it exits (or `signal` aborts the iteration; the process runs on).
   */
  async *output(pid, options) {
    const opts = checkKeys(options, new Set(['signal']), 'output option')
    let offset = 0
    for (;;) {
      if (opts.signal?.aborted) return
      const since = await this.#json('since', { pid, offset, waitMs: 1000 })
      for (const chunk of since.chunks) yield { stream: chunk.stream, data: Buffer.from(chunk.data, 'base64') }
      offset = since.next
      if (since.exit) return
    }
  }

  /** The output of process `pid` kept so far (the last 1 MiB), stdout and stderr as written. */
  async logs(pid) {
    const since = await this.#json('since', { pid, offset: 0, waitMs: 0 })
    return Buffer.concat(since.chunks.map((chunk) => Buffer.from(chunk.data, 'base64')))
  }

  async wait(pid) {
    return liveExit(await this.#json('wait', { pid }))
  }

  async kill(pid, signal = 15) {
    await this.#call('kill', { pid, signal })
  }

  async writeStdin(pid, data) {
    await this.#call('writeStdin', { pid }, bytesOf(data))
  }

  async closeStdin(pid) {
    await this.#call('closeStdin', { pid })
  }

  async resize(pid, rows, cols) {
    await this.#call('resize', { pid, rows, cols })
  }

  async pause() {
    return this.#json('pause')
  }

  async resume() {
    await this.#call('resume')
  }

  async publish(guestPort, options) {
    const opts = checkKeys(options, new Set(['hostPort', 'hostIp']), 'publish option')
    const port = await this.#json('publish', { guestPort, hostPort: opts.hostPort, hostIp: opts.hostIp })
    return { hostIp: port.host_ip, hostPort: port.host_port, guestPort: port.guest_port }
  }

  async readFile(path) {
    return this.#call('readFile', { path: pathArg(path, 'path') })
  }

  async writeFile(path, data) {
    await this.#call('writeFile', { path: pathArg(path, 'path') }, bytesOf(data))
  }

  async listDir(path) {
    return this.#json('listDir', { path: pathArg(path, 'path') })
  }

  async stat(path) {
    return this.#json('stat', { path: pathArg(path, 'path') })
  }

  async mkdir(path, options) {
    const opts = checkKeys(options, new Set(['parents']), 'mkdir option')
    await this.#call('mkdir', { path: pathArg(path, 'path'), parents: opts.parents === true })
  }

  async rename(from, to) {
    await this.#call('rename', { from: pathArg(from, 'from'), to: pathArg(to, 'to') })
  }

  async remove(path) {
    await this.#call('remove', { path: pathArg(path, 'path') })
  }

  async upload(hostPath, path) {
    return this.#json('upload', { from: nodePath.resolve(pathArg(hostPath, 'hostPath')), to: pathArg(path, 'path') })
  }

  async download(path, hostPath) {
    return this.#json('download', { from: pathArg(path, 'path'), to: nodePath.resolve(pathArg(hostPath, 'hostPath')) })
  }

  /** Ends the sandbox and every process in it; resolves once all of it is gone. */
  async stop() {
    await this.#call('stop')
  }

  async [Symbol.asyncDispose]() {
    await this.stop()
  }
}

function snapshotInfo(info) {
  return {
    id: info.id,
    name: info.name,
    backend: info.backend,
    source: info.source,
    createdAt: info.created_at,
    carries: info.carries,
    notCarried: info.not_carried,
    files: info.files,
    bytes: info.bytes,
  }
}

/** The snapshots in the store that verify, oldest first. */
async function snapshots(options) {
  const opts = checkKeys(options, new Set(['snapshotDir']), 'snapshots option')
  return JSON.parse(unwrap(await native.listSnapshots(opts.snapshotDir))).map(snapshotInfo)
}

/** Removes a snapshot, leaving nothing of it. */
async function removeSnapshot(name, options) {
  if (typeof name !== 'string') throw new InvalidRequestError('name must be a snapshot name')
  const opts = checkKeys(options, new Set(['snapshotDir']), 'removeSnapshot option')
  unwrap(await native.removeSnapshot(name, opts.snapshotDir))
}

/** A transactional copy of a host directory. See index.d.ts. */
class Workspace {
  #native

  constructor(source, options) {
    const opts = checkKeys(options, new Set(['limit']), 'Workspace option')
    if (typeof source !== 'string') throw new InvalidRequestError('source must be a path string')
    this.#native = unwrap(native.stageWorkspace(source, opts.limit))
  }

  get [NATIVE]() {
    return this.#native
  }

  get source() {
    return this.#native.source
  }

  get path() {
    return unwrap(this.#native.path())
  }

  diff() {
    return JSON.parse(unwrap(this.#native.diff()))
  }

  commit(options) {
    const opts = checkKeys(options, new Set(['paths', 'accept', 'allOrNothing', 'sandbox']), 'commit option')
    if (opts.sandbox !== undefined && !(opts.sandbox instanceof Sandbox)) {
      throw new InvalidRequestError('sandbox must be a Sandbox')
    }
    return JSON.parse(unwrap(this.#native.commit(opts.paths, opts.accept, opts.allOrNothing, opts.sandbox?.[NATIVE]())))
  }

  discard() {
    unwrap(this.#native.discard() ?? null)
  }
}

/** The narrowest caps for one tool call, from the tool's JSON schema. See index.d.ts. */
function capsForCall(schema, args, base, options) {
  const opts = checkKeys(options, new Set(['tier', 'program']), 'capsForCall option')
  return JSON.parse(unwrap(native.capsForCall(JSON.stringify(schema), JSON.stringify(args ?? {}), base ?? null, opts.tier, opts.program)))
}

/** Checks an audit log's hash chain: `{ records, head }`, or throws naming the first bad record. */
function verifyAudit(path, options) {
  const opts = checkKeys(options, new Set(['head']), 'verifyAudit option')
  if (typeof path !== 'string') throw new InvalidRequestError('path must be a string')
  const verified = JSON.parse(native.verifyAuditJson(path, opts.head))
  if (verified.error) throw new InvalidRequestError(verified.error)
  return verified
}

/** A preset tier (`low`, `medium`, `high`) as an object, to inspect or adapt for `tiers`. */
function tierPreset(name, home) {
  const tier = JSON.parse(native.tierPresetJson(String(name), home))
  if (tier.error) throw new InvalidRequestError(tier.error)
  return tier
}

const version = native.version()
const { codeTool, commandTool, aiSdkTool } = require('./adapters.js')({ Sandbox, Tool }, checkKeys)

// One object literal of plain names, so ES modules can `import { Sandbox } from ...`.
module.exports = {
  Sandbox,
  Tool,
  doctor,
  verifyAudit,
  tierPreset,
  AgentDirectory,
  MessageVerifier,
  Workspace,
  Session,
  LiveSandbox,
  snapshots,
  removeSnapshot,
  generateAgentKey,
  agentPublicKey,
  capsForCall,
  version,
  helperPath,
  StrataError,
  InvalidRequestError,
  DeniedError,
  BackendUnavailableError,
  UnenforceableError,
  LimitExceededError,
  ToolFailedError,
  CancelledError,
  SetupFailedError,
  InternalError,
  codeTool,
  commandTool,
  aiSdkTool,
}
