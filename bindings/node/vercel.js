'use strict'
// `strata-sandbox/vercel`: a Strata session in the two sandbox shapes of Vercel's
// JavaScript ecosystem, so code and tools written for them run on Strata unchanged:
//
// - StrataSandbox: the `Sandbox` class of `@vercel/sandbox` (runCommand, sync or detached
//   with logs()/wait()/kill(), writeFiles, readFile, readFileToBuffer, downloadFile,
//   mkDir, stop). `bash-tool`'s createBashTool() takes it as a Vercel sandbox.
// - StrataSandboxSession: the AI SDK's `Experimental_SandboxSession` (ai v7): run, spawn
//   with byte streams and kill, and the file methods. Pass it as `experimental_sandbox`
//   to generateText/streamText/agents; tools get it in their execute options.
//
// Both wrap one Strata Session: a private directory mounted read-write at the session's
// workdir (default /workspace) in every call, each command one sandbox run. A
// StrataSandbox can instead wrap a live sandbox (`StrataSandbox.create({ live: true })`):
// one sandbox for its whole life, as a Vercel sandbox is, so a detached command (a dev
// server) keeps running between commands, kill() sends its signal to that command only,
// and `ports` are published on host loopback for domain(). No dependency on any of those
// packages: the shapes are mirrored (vercel.d.ts says which versions) and checked against
// the real packages by test/vercel.test.js.

const fs = require('node:fs')
const os = require('node:os')
const hostPath = require('node:path')
const guestPath = require('node:path').posix
const crypto = require('node:crypto')
const { Readable } = require('node:stream')
const { StringDecoder } = require('node:string_decoder')
const strata = require('./index.js')

const { InvalidRequestError, ToolFailedError, CancelledError } = strata

function checkKeys(object, allowed, what) {
  if (object === undefined || object === null) return {}
  if (typeof object !== 'object') throw new InvalidRequestError(`${what} must be an object`)
  for (const key in object) {
    if (!allowed.has(key)) {
      throw new InvalidRequestError(`unknown ${what} key ${JSON.stringify(key)} (expected one of ${[...allowed].join(', ')})`)
    }
  }
  return object
}

/** The Strata session behind a StrataSandbox, a StrataSandboxSession or a session itself. */
function sessionOf(value) {
  const session = value instanceof StrataSandbox || value instanceof StrataSandboxSession ? value.session : value
  if (!session || typeof session.run !== 'function' || typeof session.readFile !== 'function') {
    throw new InvalidRequestError('expected a Strata session (sandbox.session(...)), a StrataSandbox or a StrataSandboxSession')
  }
  return session
}

/** A guest path: absolute ones normalized, relative ones resolved against `base`. */
function resolveIn(base, path) {
  if (typeof path !== 'string' || path === '') throw new InvalidRequestError('path must be a non-empty string')
  return guestPath.resolve(base, path)
}

const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/

/**
 * The argv of one call: `[cmd, ...args]`, under env(1) when the call sets a working
 * directory or variables (a Strata session runs every call in its workdir with the caps'
 * environment). A program name containing `=` would read as a variable to env, so such a
 * program is started through `sh -c 'exec "$@"'`.
 */
function callArgv(workdir, cmd, args, cwd, env) {
  if (typeof cmd !== 'string' || cmd === '') throw new InvalidRequestError('cmd must be a non-empty string')
  if (args !== undefined && args !== null && !Array.isArray(args)) throw new InvalidRequestError('args must be an array of strings')
  const argv = [cmd, ...(args ?? [])]
  for (const arg of argv) if (typeof arg !== 'string') throw new InvalidRequestError('args must be an array of strings')
  const dir = cwd === undefined || cwd === null ? workdir : resolveIn(workdir, cwd)
  const pairs = []
  if (env !== undefined && env !== null) {
    if (typeof env !== 'object') throw new InvalidRequestError('env must be an object of strings')
    for (const [name, value] of Object.entries(env)) {
      if (!ENV_NAME.test(name)) throw new InvalidRequestError(`bad environment variable name ${JSON.stringify(name)}`)
      if (typeof value !== 'string') throw new InvalidRequestError(`environment variable ${name} must be a string`)
      pairs.push(`${name}=${value}`)
    }
  }
  if (dir === workdir && pairs.length === 0) return { argv, cwd: dir }
  const prefix = ['env', ...(dir === workdir ? [] : ['-C', dir]), '--', ...pairs]
  const program = cmd.includes('=') ? ['sh', '-c', 'exec "$@"', 'sh', ...argv] : argv
  return { argv: [...prefix, ...program], cwd: dir }
}

/**
 * The argv and working directory of one command on a live sandbox: checked as
 * {@link callArgv} checks them, but the live sandbox takes the working directory and the
 * variables itself (no env(1) around the program).
 */
function liveCall(workdir, cmd, args, cwd, env) {
  if (typeof cmd !== 'string' || cmd === '') throw new InvalidRequestError('cmd must be a non-empty string')
  if (args !== undefined && args !== null && !Array.isArray(args)) throw new InvalidRequestError('args must be an array of strings')
  const argv = [cmd, ...(args ?? [])]
  for (const arg of argv) if (typeof arg !== 'string') throw new InvalidRequestError('args must be an array of strings')
  if (env !== undefined && env !== null) {
    if (typeof env !== 'object') throw new InvalidRequestError('env must be an object of strings')
    for (const [name, value] of Object.entries(env)) {
      if (!ENV_NAME.test(name)) throw new InvalidRequestError(`bad environment variable name ${JSON.stringify(name)}`)
      if (typeof value !== 'string') throw new InvalidRequestError(`environment variable ${name} must be a string`)
    }
  }
  return { argv, cwd: cwd === undefined || cwd === null ? workdir : resolveIn(workdir, cwd) }
}

/** A number for an exit status: the code, else 128 + the signal, else 124 (timeout) or 137. */
function exitCodeOf(result) {
  if (typeof result.exitCode === 'number') return result.exitCode
  if (typeof result.signal === 'number') return 128 + result.signal
  return result.timedOut ? 124 : 137
}

// The signals kill() takes (those of @vercel/sandbox that end a process). A Strata call
// ends as a whole, every process of it, whichever is named; the exit code reports it.
const SIGNALS = { SIGHUP: 1, SIGINT: 2, SIGQUIT: 3, SIGKILL: 9, SIGTERM: 15 }

function signalNumber(signal) {
  if (signal === undefined || signal === null) return SIGNALS.SIGTERM
  if (typeof signal === 'number' && Number.isInteger(signal) && signal > 0 && signal < 65) return signal
  if (typeof signal === 'string' && Object.hasOwn(SIGNALS, signal)) return SIGNALS[signal]
  throw new InvalidRequestError(
    `kill() takes a signal that ends the command (${Object.keys(SIGNALS).join(', ')} or a number), not ${JSON.stringify(signal)}`,
  )
}

/** A signal that aborts when `signal` (if any) or `controller` does; `unlink` drops the listener. */
function linkSignal(signal, controller) {
  if (!signal) return { signal: controller.signal, unlink() {} }
  const onAbort = () => controller.abort(signal.reason)
  if (signal.aborted) onAbort()
  else signal.addEventListener('abort', onAbort, { once: true })
  return { signal: controller.signal, unlink: () => signal.removeEventListener('abort', onAbort) }
}

function abortError(signal) {
  return signal.reason ?? new DOMException('This operation was aborted', 'AbortError')
}

/** Resolves with `promise`, or rejects with the signal's reason when it aborts first. */
function abortable(promise, signal) {
  if (!signal) return promise
  if (signal.aborted) return Promise.reject(abortError(signal))
  return new Promise((resolve, reject) => {
    const onAbort = () => reject(abortError(signal))
    signal.addEventListener('abort', onAbort, { once: true })
    promise.then(resolve, reject).finally(() => signal.removeEventListener('abort', onAbort))
  })
}

/** A guest path's directory entry (`listFiles` form), `null` when nothing is there, or
 * `undefined` when that cannot be told (outside the workdir, a closed session, ...). */
async function lookup(session, path) {
  const root = session.workdir
  if (path === root) return { path: root, name: guestPath.basename(root), kind: 'dir', size: 0, mode: 0o700 }
  if (!path.startsWith(root === '/' ? '/' : `${root}/`)) return undefined
  const find = async (dir, name) => (await session.listFiles(dir)).find((entry) => entry.name === name) ?? null
  try {
    return await find(guestPath.dirname(path), guestPath.basename(path))
  } catch {
    // The parent is missing or not a directory, or the listing failed for another reason:
    // walk down from the workdir to tell which.
  }
  try {
    const parts = path.slice(root.length).split('/').filter(Boolean)
    let dir = root
    for (let i = 0; i < parts.length; i++) {
      const entry = await find(dir, parts[i])
      if (entry === null || i === parts.length - 1) return entry
      if (entry.kind !== 'dir') return null
      dir = guestPath.join(dir, parts[i])
    }
  } catch {
    return undefined
  }
  return undefined
}

/** `session.readFile`, or `null` when the file does not exist. */
async function readOrNull(session, path) {
  try {
    return await session.readFile(path)
  } catch (error) {
    if ((await lookup(session, path)) === null) return null
    throw error
  }
}

function asBytes(content, what) {
  if (typeof content === 'string') return Buffer.from(content, 'utf8')
  if (content instanceof Uint8Array) return content
  if (content instanceof ArrayBuffer) return new Uint8Array(content)
  throw new InvalidRequestError(`${what} must be a string, a Buffer or a Uint8Array`)
}

/** A failed helper command as an error that carries its result. */
function failed(what, result) {
  const error = new ToolFailedError(`${what} failed (${result.status ?? `exit code ${result.exitCode}`}): ${result.stderr.trim()}`)
  error.result = result
  return error
}

// ---------------------------------------------------------------------------------------
// @vercel/sandbox shape

const COMMAND_STATE = Symbol('strata.vercel.command')
const RUN_COMMAND_KEYS = new Set(['cmd', 'args', 'cwd', 'env', 'sudo', 'detached', 'stdout', 'stderr', 'signal', 'timeoutMs'])

/**
 * One call of a session, as a command of @vercel/sandbox: its output as log lines (kept
 * from the start, so every logs() replays it all), its end, and kill().
 */
class CommandState {
  constructor({ cmdId, cwd, argv }) {
    this.cmdId = cmdId
    this.cwd = cwd
    this.argv = argv
    this.startedAt = Date.now()
    this.logs = []
    this.decoders = { stdout: new StringDecoder('utf8'), stderr: new StringDecoder('utf8') }
    this.sinks = {}
    this.changed = null // resolves when a log line is added or the command ends
    this.wake = null
    this.ended = null // { result } | { killedWith } | { error }
    this.controller = new AbortController()
    this.killSignal = null
    this.done = null // resolves (never rejects) when the call is over
    // Ends the command with a signal number (set by whoever runs it).
    this.kill = (number) => {
      if (this.killSignal === null) this.killSignal = number
      this.controller.abort(new Error(`killed with signal ${number}`))
    }
  }

  push(stream, chunk) {
    const data = this.decoders[stream].write(chunk)
    if (data) this.add(stream, data)
  }

  add(stream, data) {
    this.logs.push({ stream, data })
    const sink = this.sinks[stream]
    if (sink) {
      try {
        sink.write(data)
      } catch {
        // A broken sink does not end the command (a throw here would cancel the call).
      }
    }
    this.notify()
  }

  notify() {
    const wake = this.wake
    this.changed = null
    this.wake = null
    if (wake) wake()
  }

  nextChange() {
    if (!this.changed) this.changed = new Promise((resolve) => (this.wake = resolve))
    return this.changed
  }

  end(ended) {
    for (const stream of ['stdout', 'stderr']) {
      const rest = this.decoders[stream].end()
      if (rest) this.add(stream, rest)
    }
    this.ended = ended
    this.notify()
  }

  text(stream) {
    let text = ''
    for (const line of this.logs) if (stream === 'both' || line.stream === stream) text += line.data
    return text
  }
}

/**
 * A command started with `runCommand({ ..., detached: true })`, as in @vercel/sandbox: its
 * `logs()`, `wait()`, `output()`, `stdout()`, `stderr()` and `kill()`. Made by
 * {@link StrataSandbox.runCommand}, never directly.
 */
class Command {
  constructor(state) {
    if (!(state instanceof CommandState)) throw new TypeError('Command objects are made by StrataSandbox.runCommand')
    Object.defineProperty(this, COMMAND_STATE, { value: state })
  }

  /** The exit code once the command ended (128 + the signal after kill()), else `null`. */
  get exitCode() {
    const ended = this[COMMAND_STATE].ended
    if (!ended) return null
    if (ended.result) return exitCodeOf(ended.result)
    if (ended.killedWith !== undefined) return 128 + ended.killedWith
    return null
  }

  /** How long the sandboxed run took, in milliseconds, once it ended by itself. */
  get durationMs() {
    return this[COMMAND_STATE].ended?.result?.durationMs
  }

  get cmdId() {
    return this[COMMAND_STATE].cmdId
  }

  /** The working directory the command runs in (a guest path). */
  get cwd() {
    return this[COMMAND_STATE].cwd
  }

  /** When it started, in milliseconds since the epoch. */
  get startedAt() {
    return this[COMMAND_STATE].startedAt
  }

  /** Strata's result of the call once it ended by itself (`null` while it runs or after kill()). */
  get result() {
    return this[COMMAND_STATE].ended?.result ?? null
  }

  /**
   * The output as `{ stream, data }` lines, from the start of the command, live until it
   * ends. `signal` stops the iteration (it rejects with the signal's reason).
   */
  logs(opts) {
    const { signal } = checkKeys(opts, new Set(['signal']), 'logs option')
    const state = this[COMMAND_STATE]
    let closed = false
    let onClose
    const closing = new Promise((resolve) => (onClose = resolve))
    async function* lines() {
      let next = 0
      for (;;) {
        if (signal?.aborted) throw abortError(signal)
        while (next < state.logs.length && !closed) {
          const line = state.logs[next++]
          yield { stream: line.stream, data: line.data }
          if (signal?.aborted) throw abortError(signal)
        }
        if (closed) return
        if (state.ended) {
          if (state.ended.error) throw state.ended.error
          return
        }
        await abortable(Promise.race([state.nextChange(), closing]), signal)
      }
    }
    const iterator = lines()
    // Ends the iteration, also while it waits for output.
    iterator.close = () => {
      closed = true
      onClose()
    }
    if (Symbol.dispose) iterator[Symbol.dispose] = iterator.close
    return iterator
  }

  /**
   * Resolves with the finished command when it ends: by itself, by kill() (exit code
   * 128 + the signal) or by the session's stop(). Rejects when the call failed (it was
   * refused, or cancelled through the `signal` given to runCommand). `params.signal` only
   * stops waiting.
   */
  async wait(params) {
    const { signal } = checkKeys(params, new Set(['signal']), 'wait option')
    const state = this[COMMAND_STATE]
    await abortable(state.done, signal)
    if (state.ended.error) throw state.ended.error
    return new CommandFinished(state)
  }

  /** The output of `stdout`, `stderr` or `both` (in the order it came) once the command ended. */
  async output(stream = 'both', opts) {
    if (stream !== 'stdout' && stream !== 'stderr' && stream !== 'both') {
      throw new InvalidRequestError(`stream must be "stdout", "stderr" or "both", not ${JSON.stringify(stream)}`)
    }
    await this.wait(opts)
    return this[COMMAND_STATE].text(stream)
  }

  stdout(opts) {
    return this.output('stdout', opts)
  }

  stderr(opts) {
    return this.output('stderr', opts)
  }

  /**
   * Ends the command: the whole sandbox of its call, every process in it, whatever
   * `signal` names (default `'SIGTERM'`); wait() then gives exit code 128 + that signal's
   * number. Resolves when everything of the call is gone. A no-op once it ended.
   */
  async kill(signal, opts) {
    const number = signalNumber(signal)
    const { abortSignal } = checkKeys(opts, new Set(['abortSignal']), 'kill option')
    const state = this[COMMAND_STATE]
    if (!state.ended) state.kill(number)
    await abortable(state.done, abortSignal)
  }
}

/** A command that has ended: `exitCode` is a number. */
class CommandFinished extends Command {
  constructor(state) {
    if (!(state instanceof CommandState) || !state.ended || state.ended.error) {
      throw new TypeError('CommandFinished objects are made by StrataSandbox.runCommand and Command.wait')
    }
    super(state)
  }

  /** @deprecated As in @vercel/sandbox: the command has ended already. */
  async wait() {
    return this
  }
}

const CREATE_KEYS = new Set(['sandbox', 'caps', 'workdir', 'maxTransfer', 'signal', 'live', 'ports', 'timeout'])

/** A live sandbox's file, or `null` when nothing is there. */
async function readLiveOrNull(live, path) {
  try {
    return await live.readFile(path)
  } catch (error) {
    if (error?.code === 'invalid_request' && /\bnot found\b/.test(error.message)) return null
    throw error
  }
}

// Private workdirs of live sandboxes not stopped yet: removed when the process exits.
const liveWorkdirs = new Set()
process.once('exit', () => {
  for (const dir of liveWorkdirs) fs.rmSync(dir, { recursive: true, force: true })
})

/** `{ guestPort: 'http://IP:PORT' }` of a live sandbox's published ports. */
function portRoutes(published) {
  const routes = new Map()
  for (const port of published ?? []) {
    const guest = port.guestPort ?? port.guest_port
    const ip = port.hostIp ?? port.host_ip
    const host = port.hostPort ?? port.host_port
    routes.set(guest, `http://${ip.includes(':') ? `[${ip}]` : ip}:${host}`)
  }
  return routes
}

/**
 * A Strata session in the shape of @vercel/sandbox's `Sandbox`. Paths are guest paths:
 * relative ones resolve against the session's workdir (`cwd`), absolute ones must lie in
 * it. Every command is one sandbox run with the session's caps; files persist between
 * commands until stop().
 */
class StrataSandbox {
  #session
  #live = null
  #privateDir = null
  #workdir
  #routes = new Map()
  #caps
  #commands = new Map()

  /**
   * Wraps a Strata session, or a live sandbox (`strata.LiveSandbox`; options `workdir`,
   * default the caps' workdir else `/tmp`, and `ports`: its published ports, for domain()).
   */
  constructor(session, options) {
    const opts = checkKeys(options, new Set(['caps', 'workdir', 'ports']), 'StrataSandbox option')
    this.#caps = opts.caps ?? null
    if (session instanceof strata.LiveSandbox) {
      this.#live = session
      this.#workdir = opts.workdir ?? this.#caps?.workdir ?? '/tmp'
      if (typeof this.#workdir !== 'string' || !this.#workdir.startsWith('/')) {
        throw new InvalidRequestError('workdir must be an absolute path inside the sandbox')
      }
      this.#routes = portRoutes(opts.ports)
      return
    }
    if (opts.workdir !== undefined || opts.ports !== undefined) {
      throw new InvalidRequestError('workdir and ports are options of a wrapped live sandbox; a session has its own workdir and no ports')
    }
    this.#session = sessionOf(session)
    this.#workdir = this.#session.workdir
  }

  /**
   * A new session of `params.sandbox` (default `new Sandbox()`) with `caps`, `workdir`
   * (default `/workspace`) and `maxTransfer`, wrapped. Like `Sandbox.create` of
   * @vercel/sandbox it resolves to a sandbox that `await using` stops.
   */
  static async create(params) {
    const { sandbox, caps, workdir, maxTransfer, signal, live, ports, timeout } = checkKeys(
      params,
      CREATE_KEYS,
      'StrataSandbox.create parameter',
    )
    signal?.throwIfAborted()
    if (live !== undefined && typeof live !== 'boolean') throw new InvalidRequestError('live must be true or false')
    if (!live && (ports !== undefined || timeout !== undefined)) {
      throw new InvalidRequestError(
        'ports and timeout need a live sandbox: StrataSandbox.create({ live: true, ports, timeout }) (a session runs each command in a sandbox of its own)',
      )
    }
    if (live) {
      if (maxTransfer !== undefined) throw new InvalidRequestError('maxTransfer is an option of a session, not of a live sandbox')
      if (timeout !== undefined && !(typeof timeout === 'number' && timeout > 0)) {
        throw new InvalidRequestError('timeout must be a number of milliseconds above 0 (the sandbox\'s lifetime)')
      }
      const options = {}
      if (ports !== undefined) options.publish = ports
      if (timeout !== undefined) options.ttl = Math.ceil(timeout / 1000)
      // The workdir is a private host directory (0700) mounted read-write, as a session's is
      // (the sandbox's /tmp is noexec), unless the caps bring a workdir of their own.
      const guest = workdir ?? (caps?.workdir ? null : '/workspace')
      let liveCaps = caps ?? null
      let privateDir = null
      if (guest !== null) {
        if (typeof guest !== 'string' || !guest.startsWith('/')) {
          throw new InvalidRequestError('workdir must be an absolute path inside the sandbox')
        }
        privateDir = await fs.promises.mkdtemp(hostPath.join(fs.realpathSync(os.tmpdir()), 'strata-vercel-'))
        liveWorkdirs.add(privateDir)
        const mounts = [...(caps?.mounts ?? []), { host: privateDir, guest, access: 'rw' }]
        liveCaps = { ...(caps ?? {}), mounts, workdir: guest }
      }
      let started = null
      try {
        started = await (sandbox ?? new strata.Sandbox()).start(liveCaps, options)
        signal?.throwIfAborted()
        const info = await started.info()
        const wrapped = new StrataSandbox(started, { caps: liveCaps, ports: info.ports })
        StrataSandbox.#adopt(wrapped, privateDir)
        return wrapped
      } catch (error) {
        if (started) await started.stop()
        if (privateDir) {
          liveWorkdirs.delete(privateDir)
          await fs.promises.rm(privateDir, { recursive: true, force: true })
        }
        throw error
      }
    }
    const options = {}
    if (workdir !== undefined) options.workdir = workdir
    if (maxTransfer !== undefined) options.maxTransfer = maxTransfer
    const session = (sandbox ?? new strata.Sandbox()).session(caps ?? null, options)
    return new StrataSandbox(session, { caps })
  }

  /** Makes `dir` the sandbox's own workdir: removed when it stops. */
  static #adopt(sandbox, dir) {
    sandbox.#privateDir = dir
  }

  /** The Strata session (`undefined` for a live sandbox). */
  get session() {
    return this.#session
  }

  /** The live sandbox (`strata.LiveSandbox`), else `null` (a session). */
  get live() {
    return this.#live
  }

  /** The caps given to {@link StrataSandbox.create} (or the constructor), else `null`. */
  get caps() {
    return this.#caps
  }

  /** The session id (`s-` and 32 hex digits): @vercel/sandbox v1/v2's `sandboxId`. */
  get sandboxId() {
    return (this.#live ?? this.#session).id
  }

  /** The session id: @vercel/sandbox v3's `name`. */
  get name() {
    return (this.#live ?? this.#session).id
  }

  /** The working directory of commands and base of relative paths: the session's workdir. */
  get cwd() {
    return this.#workdir
  }

  get status() {
    if (this.#live) return this.#live.stopped ? 'stopped' : 'running'
    return this.#session.closed ? 'stopped' : 'running'
  }

  /**
   * Runs a command: `runCommand(cmd, args?, { signal?, timeoutMs? })` or
   * `runCommand({ cmd, args?, cwd?, env?, detached?, stdout?, stderr?, signal?, timeoutMs? })`.
   * Resolves with a {@link CommandFinished} when it ends, or at once with a running
   * {@link Command} when `detached`. A non-zero exit is data, not an error. `signal`
   * cancels the call (it then rejects, or its wait() does, with a CancelledError);
   * `timeoutMs` replaces the caps' timeout (0: none). `sudo: true` is refused: commands
   * run unprivileged.
   */
  async runCommand(commandOrParams, args, opts) {
    let params
    if (typeof commandOrParams === 'string') {
      const { signal, timeoutMs } = checkKeys(opts, new Set(['signal', 'timeoutMs']), 'runCommand option')
      params = { cmd: commandOrParams, args, signal, timeoutMs }
    } else {
      params = checkKeys(commandOrParams, RUN_COMMAND_KEYS, 'runCommand parameter')
    }
    if (params.sudo) throw new InvalidRequestError('sudo is not available: commands in a Strata sandbox run unprivileged')
    if (this.#live) return this.#runLive(params)
    const session = this.#session
    const { argv, cwd } = callArgv(session.workdir, params.cmd, params.args, params.cwd, params.env)
    params.signal?.throwIfAborted()

    const state = new CommandState({ cmdId: `cmd_${crypto.randomBytes(12).toString('hex')}`, cwd, argv })
    state.sinks = { stdout: params.stdout, stderr: params.stderr }
    const link = linkSignal(params.signal, state.controller)
    const options = {
      signal: link.signal,
      onStdout: (chunk) => state.push('stdout', chunk),
      onStderr: (chunk) => state.push('stderr', chunk),
    }
    if (params.timeoutMs !== undefined) options.timeoutMs = params.timeoutMs
    state.done = session.run(argv, options).then(
      (result) => state.end({ result }),
      (error) => {
        const killed = state.killSignal !== null && !params.signal?.aborted && error?.code === 'cancelled'
        state.end(killed ? { killedWith: state.killSignal } : { error })
      },
    )
    void state.done.then(link.unlink)
    return this.#track(state, params.detached)
  }

  /**
   * Keeps `state` findable (getCommand) while it runs; resolves at once with the running
   * Command when `detached`, else with the CommandFinished once it ended.
   */
  async #track(state, detached) {
    this.#commands.set(state.cmdId, state)
    void state.done.then(() => this.#commands.delete(state.cmdId))
    if (detached) return new Command(state)
    await state.done
    if (state.ended.error) throw state.ended.error
    return new CommandFinished(state)
  }

  /**
   * runCommand on a live sandbox: the command is a process of the sandbox (spawned, its
   * output followed from the start), so a detached one outlives this call, kill() signals
   * its process group only, and `signal` kills it (the call then rejects with a
   * CancelledError).
   */
  async #runLive(params) {
    const live = this.#live
    const { argv, cwd } = liveCall(this.#workdir, params.cmd, params.args, params.cwd, params.env)
    if (params.timeoutMs !== undefined && !(typeof params.timeoutMs === 'number' && params.timeoutMs >= 0)) {
      throw new InvalidRequestError('timeoutMs must be a number of milliseconds (0: none)')
    }
    params.signal?.throwIfAborted()
    const options = { workdir: cwd }
    if (params.env) options.env = params.env
    if (params.timeoutMs) options.timeout = params.timeoutMs / 1000
    const pid = await live.spawn(argv, options)
    const state = new CommandState({ cmdId: `cmd_${crypto.randomBytes(12).toString('hex')}`, cwd, argv })
    state.sinks = { stdout: params.stdout, stderr: params.stderr }
    state.pid = pid
    let cancelled = null
    state.kill = (number) => {
      if (state.killSignal === null) state.killSignal = number
      live.kill(pid, number).catch(() => {}) // it may have ended, or the sandbox stopped
    }
    const onAbort = () => {
      cancelled = new CancelledError('the command was cancelled by its AbortSignal; it was killed', {
        cause: params.signal.reason,
      })
      live.kill(pid, SIGNALS.SIGKILL).catch(() => {})
    }
    if (params.signal?.aborted) onAbort()
    else params.signal?.addEventListener('abort', onAbort, { once: true })
    const startedAt = Date.now()
    state.done = (async () => {
      for await (const chunk of live.output(pid)) state.push(chunk.stream, chunk.data)
      return live.wait(pid)
    })().then(
      (exit) => {
        if (cancelled) return state.end({ error: cancelled })
        const result = { ...exit, durationMs: Date.now() - startedAt }
        state.end({ result })
        // The text as decoded (end() flushed the decoders).
        result.stdout = state.text('stdout')
        result.stderr = state.text('stderr')
      },
      (error) => state.end(cancelled ? { error: cancelled } : state.killSignal !== null ? { killedWith: state.killSignal } : { error }),
    )
    void state.done.then(() => params.signal?.removeEventListener('abort', onAbort))
    return this.#track(state, params.detached)
  }

  /** A running detached command of this sandbox by its `cmdId`. */
  async getCommand(cmdId) {
    const state = this.#commands.get(cmdId)
    if (!state) throw new InvalidRequestError(`no running command ${JSON.stringify(cmdId)} in session ${this.#session.id}`)
    return new Command(state)
  }

  /** Creates a directory and its missing parents (as @vercel/sandbox does: `mkdir -p`). */
  async mkDir(path, opts) {
    const { signal } = checkKeys(opts, new Set(['signal']), 'mkDir option')
    const dir = resolveIn(this.cwd, path)
    signal?.throwIfAborted()
    if (this.#live) return this.#live.mkdir(dir, { parents: true })
    const result = await this.#session.run(['mkdir', '-p', '--', dir], { signal })
    if (result.exitCode !== 0) throw failed(`mkdir ${dir}`, result)
  }

  /** The file as a Node.js readable stream, or `null` when it does not exist. */
  async readFile(file, opts) {
    const data = await this.readFileToBuffer(file, opts)
    return data === null ? null : Readable.from([data], { objectMode: false })
  }

  /** The file's bytes, or `null` when it does not exist. */
  async readFileToBuffer(file, opts) {
    const { path, cwd } = checkKeys(file, new Set(['path', 'cwd']), 'file')
    const { signal } = checkKeys(opts, new Set(['signal']), 'readFile option')
    signal?.throwIfAborted()
    const target = resolveIn(resolveIn(this.cwd, cwd ?? this.cwd), path)
    const data = this.#live ? await readLiveOrNull(this.#live, target) : await readOrNull(this.#session, target)
    return data === null ? null : Buffer.from(data.buffer, data.byteOffset, data.byteLength)
  }

  /**
   * Copies a file of the sandbox to the host (`dst` resolved against `dst.cwd`, else the
   * process's working directory). Resolves with the host path, or `null` when the file does
   * not exist. `mkdirRecursive` creates the host directory first.
   */
  async downloadFile(src, dst, opts) {
    const source = checkKeys(src, new Set(['path', 'cwd']), 'source')
    const target = checkKeys(dst, new Set(['path', 'cwd']), 'destination')
    const { mkdirRecursive, signal } = checkKeys(opts, new Set(['mkdirRecursive', 'signal']), 'downloadFile option')
    if (!source.path) throw new InvalidRequestError('downloadFile: source path is required')
    if (!target.path) throw new InvalidRequestError('downloadFile: destination path is required')
    const data = await this.readFileToBuffer(source, { signal })
    if (data === null) return null
    const out = hostPath.resolve(target.cwd ?? '', target.path)
    if (mkdirRecursive) await fs.promises.mkdir(hostPath.dirname(out), { recursive: true })
    await fs.promises.writeFile(out, data, { signal })
    return out
  }

  /**
   * Writes files (creating parent directories, replacing existing files), in order.
   * `mode` (e.g. `0o755`) is applied with chmod inside the sandbox.
   */
  async writeFiles(files, opts) {
    const { signal } = checkKeys(opts, new Set(['signal']), 'writeFiles option')
    if (!Array.isArray(files)) throw new InvalidRequestError('writeFiles takes an array of { path, content, mode? }')
    const modes = new Map()
    const writes = files.map((file) => {
      const { path, content, mode } = checkKeys(file, new Set(['path', 'content', 'mode']), 'file')
      const target = resolveIn(this.cwd, path)
      if (mode !== undefined) {
        if (!Number.isInteger(mode) || mode < 0 || mode > 0o7777) throw new InvalidRequestError(`bad mode for ${target}`)
        modes.set(mode, [...(modes.get(mode) ?? []), target])
      }
      return { target, data: asBytes(content, `content of ${target}`) }
    })
    for (const { target, data } of writes) {
      signal?.throwIfAborted()
      if (this.#live) await this.#live.writeFile(target, data)
      else await this.#session.writeFile(target, data)
    }
    for (const [mode, paths] of modes) {
      const argv = ['chmod', mode.toString(8), '--', ...paths]
      const result = this.#live
        ? await this.#live.exec(argv, { signal })
        : await this.#session.run(argv, { signal })
      if (result.exitCode !== 0) {
        const text = (bytes) => (typeof bytes === 'string' ? bytes : Buffer.from(bytes).toString('utf8'))
        throw failed(`chmod ${mode.toString(8)}`, { ...result, stdout: text(result.stdout), stderr: text(result.stderr) })
      }
    }
  }

  /**
   * The URL of a port published when the live sandbox was created (`ports`), on host
   * loopback: `http://127.0.0.1:HOSTPORT`. Throws for any other port, and always for a
   * session (it accepts no inbound connections).
   */
  domain(port) {
    const route = this.#routes.get(port)
    if (route) return route
    if (this.#live) {
      throw new InvalidRequestError(`No route for port ${port}: publish it when the sandbox is created (StrataSandbox.create({ live: true, ports: [${port}] }))`)
    }
    throw new InvalidRequestError(`No route for port ${port}: a Strata sandbox accepts no inbound connections`)
  }

  /**
   * Ends the running commands and closes the session, removing its files (a live sandbox:
   * stops it, ending every process in it). Idempotent.
   */
  async stop(opts) {
    checkKeys(opts, new Set(['signal']), 'stop option')
    const running = [...this.#commands.values()]
    if (this.#live) {
      for (const state of running) if (state.killSignal === null) state.killSignal = SIGNALS.SIGKILL
      if (!this.#live.stopped) await this.#live.stop()
      await Promise.all(running.map((state) => state.done))
      if (this.#privateDir) {
        await fs.promises.rm(this.#privateDir, { recursive: true, force: true })
        liveWorkdirs.delete(this.#privateDir)
        this.#privateDir = null
      }
      return
    }
    for (const state of running) {
      if (state.killSignal === null) state.killSignal = SIGNALS.SIGKILL
      state.controller.abort(new Error('the sandbox was stopped'))
    }
    await Promise.all(running.map((state) => state.done))
    await this.#session.close()
  }

}

if (Symbol.asyncDispose) {
  // `await using sandbox = await StrataSandbox.create()` stops it at the end of the block.
  StrataSandbox.prototype[Symbol.asyncDispose] = function asyncDispose() {
    return this.stop()
  }
}

// ---------------------------------------------------------------------------------------
// The AI SDK's Experimental_SandboxSession

const SESSION_OPTIONS = new Set(['description', 'caps', 'timeoutMs', 'shell', 'workdir'])

/**
 * A live sandbox with the calls StrataSandboxSession makes of a session (`run`, the file
 * methods, `workdir`, `id`), so one implementation serves both. `run` is a process of the
 * sandbox, its output followed until it exits; aborting kills it (the call rejects with a
 * CancelledError).
 */
function liveBacking(live, workdir) {
  return {
    live,
    workdir,
    get id() {
      return live.id
    },
    get closed() {
      return live.stopped
    },
    async run(argv, { signal, onStdout, onStderr, timeoutMs } = {}) {
      signal?.throwIfAborted()
      const options = { workdir }
      if (timeoutMs) options.timeout = timeoutMs / 1000
      const pid = await live.spawn(argv, options)
      const onAbort = () => live.kill(pid, SIGNALS.SIGKILL).catch(() => {})
      if (signal?.aborted) onAbort()
      else signal?.addEventListener('abort', onAbort, { once: true })
      const cancelled = () =>
        new CancelledError('the command was cancelled by its AbortSignal; it was killed', { cause: signal.reason })
      try {
        const out = { stdout: [], stderr: [] }
        for await (const chunk of live.output(pid)) {
          out[chunk.stream].push(chunk.data)
          ;(chunk.stream === 'stdout' ? onStdout : onStderr)?.(chunk.data)
        }
        const exit = await live.wait(pid)
        if (signal?.aborted) throw cancelled()
        const text = (chunks) => Buffer.concat(chunks).toString('utf8')
        return { ...exit, stdout: text(out.stdout), stderr: text(out.stderr) }
      } catch (error) {
        // Following a process that was just killed may fail too: the abort is the cause.
        throw signal?.aborted && !(error instanceof CancelledError) ? cancelled() : error
      } finally {
        signal?.removeEventListener('abort', onAbort)
      }
    },
    readFile: (path) => live.readFile(path),
    writeFile: (path, data) => live.writeFile(path, data),
    listFiles: async (dir) => (await live.listDir(dir ?? workdir)).map((entry) => ({ ...entry, path: guestPath.join(dir ?? workdir, entry.name) })),
    remove: (path) => live.remove(path),
  }
}
const PROCESS_KEYS = new Set(['command', 'workingDirectory', 'env', 'abortSignal'])
const PATH_KEYS = new Set(['path', 'abortSignal'])

function describe(session, caps, shell) {
  const c = caps ?? null
  const parts = session.live
    ? [
        `Strata live sandbox ${session.id}.`,
        `Commands run with ${shell} in ${session.workdir}, the base of relative paths, all in the same sandbox: files persist and processes started in the background keep running between commands.`,
      ]
    : [
        `Strata sandbox session ${session.id}.`,
        `Commands run with ${shell} in ${session.workdir}, the base of relative paths; files there persist between commands for the life of the session.`,
        'Each command runs in a fresh sandbox: no process outlives its command, and /tmp is private to it.',
      ]
  if (c) {
    parts.push(c.net === undefined || c.net === null || c.net === 'none' ? 'No network access.' : 'Network access is restricted.')
    if (typeof c.timeoutMs === 'number') parts.push(`Commands are stopped after ${c.timeoutMs / 1000} s.`)
  }
  return parts.join(' ')
}

/** The lines `startLine`..`endLine` (1-based, inclusive) of a text, as the AI SDK cuts them. */
function extractLines(text, startLine, endLine) {
  if (startLine == null && endLine == null) return text
  const ending = text.includes('\r\n') ? '\r\n' : text.includes('\n') ? '\n' : text.includes('\r') ? '\r' : '\n'
  const lines = text.split(ending)
  const start = Math.max(1, startLine ?? 1) - 1
  const end = Math.min(lines.length, endLine ?? lines.length)
  return lines.slice(start, end).join(ending)
}

function checkEncoding(encoding) {
  if (!Buffer.isEncoding(encoding)) throw new InvalidRequestError(`unknown encoding ${JSON.stringify(encoding)}`)
  return encoding
}

async function collect(stream) {
  const chunks = []
  const reader = stream.getReader()
  for (;;) {
    const { value, done } = await reader.read()
    if (done) break
    chunks.push(asBytes(value, 'a chunk of content'))
  }
  return Buffer.concat(chunks)
}

/** A byte stream fed by a run's callback; pushes after the reader cancelled are dropped. */
function byteStream() {
  let controller
  let open = true
  const stream = new ReadableStream({
    start(c) {
      controller = c
    },
    cancel() {
      open = false
    },
  })
  return {
    stream,
    push(chunk) {
      if (open) controller.enqueue(new Uint8Array(chunk))
    },
    close() {
      if (open) controller.close()
      open = false
    },
    error(error) {
      if (open) controller.error(error)
      open = false
    },
  }
}

/**
 * A Strata session as the AI SDK's `Experimental_SandboxSession` (ai v7): pass it as
 * `experimental_sandbox` to generateText, streamText or an agent; tools get it in their
 * execute options and description functions. Commands run with `bash -c` (option
 * `shell`), one sandbox run each, in the session's workdir; relative paths resolve there.
 */
class StrataSandboxSession {
  #session
  #caps
  #description
  #timeoutMs
  #shell

  /**
   * @param session A Strata session, or a StrataSandbox.
   * @param options `description` (default: one made from the session and `caps`), `caps`
   *   (what the session was made with, for the description), `timeoutMs` (per command,
   *   replacing the caps' timeout; 0: none), `shell` (default `'bash'`).
   */
  constructor(session, options) {
    const opts = checkKeys(options, SESSION_OPTIONS, 'StrataSandboxSession option')
    if (session instanceof strata.LiveSandbox || (session instanceof StrataSandbox && session.live)) {
      const live = session instanceof StrataSandbox ? session.live : session
      const workdir = opts.workdir ?? (session instanceof StrataSandbox ? session.cwd : '/tmp')
      if (typeof workdir !== 'string' || !workdir.startsWith('/')) {
        throw new InvalidRequestError('workdir must be an absolute path inside the sandbox')
      }
      this.#session = liveBacking(live, workdir)
    } else {
      if (opts.workdir !== undefined) throw new InvalidRequestError('workdir is an option for a live sandbox; a session has its own')
      this.#session = sessionOf(session)
    }
    this.#caps = opts.caps ?? (session instanceof StrataSandbox ? session.caps : null)
    this.#description = opts.description
    this.#timeoutMs = opts.timeoutMs
    this.#shell = opts.shell ?? 'bash'
    if (typeof this.#shell !== 'string' || this.#shell === '') throw new InvalidRequestError('shell must be a program name')
  }

  /** The Strata session (for a live sandbox, an adapter whose `live` is the LiveSandbox). */
  get session() {
    return this.#session
  }

  /** What the model should know of the environment (for instructions). */
  get description() {
    return this.#description ?? describe(this.#session, this.#caps, this.#shell)
  }

  #call(options, what) {
    const { command, workingDirectory, env } = checkKeys(options, PROCESS_KEYS, what)
    if (typeof command !== 'string') throw new InvalidRequestError('command must be a string')
    return callArgv(this.#session.workdir, this.#shell, ['-c', command], workingDirectory, env).argv
  }

  #runOptions(extra) {
    return this.#timeoutMs === undefined ? extra : { ...extra, timeoutMs: this.#timeoutMs }
  }

  /** Runs `command` to its end: `{ exitCode, stdout, stderr }`. `abortSignal` kills it (the promise rejects). */
  async run(options) {
    const argv = this.#call(options, 'run option')
    const signal = options.abortSignal
    signal?.throwIfAborted()
    const result = await this.#session.run(argv, this.#runOptions({ signal }))
    return { exitCode: exitCodeOf(result), stdout: result.stdout, stderr: result.stderr }
  }

  /**
   * Starts `command`: its stdout and stderr as byte streams while it runs, `wait()` for the
   * exit code, `kill()` to end it (and everything it started; wait() then gives 137).
   * `abortSignal` kills it too, and wait() rejects with the signal's reason. `stdin: true`
   * rejects before anything starts: a Strata call's standard input is fixed by its caps.
   */
  async spawn(options) {
    const { stdin, ...rest } = options ?? {}
    if (this.#session.live) return this.#spawnLive(rest, Boolean(stdin))
    if (stdin) {
      throw new InvalidRequestError('spawn({ stdin: true }) is not supported: a Strata call takes its standard input from its caps')
    }
    const argv = this.#call(rest, 'spawn option')
    const abortSignal = rest.abortSignal
    abortSignal?.throwIfAborted()
    const controller = new AbortController()
    const link = linkSignal(abortSignal, controller)
    const signal = link.signal
    const stdout = byteStream()
    const stderr = byteStream()
    let killed = false
    const ended = this.#session
      .run(argv, this.#runOptions({ signal, onStdout: stdout.push, onStderr: stderr.push }))
      .then(
        (result) => ({ exitCode: exitCodeOf(result) }),
        (error) => {
          if (abortSignal?.aborted) throw abortError(abortSignal)
          if (killed && error?.code === 'cancelled') return { exitCode: 137 }
          throw error
        },
      )
    void ended.then(link.unlink, link.unlink)
    ended.then(
      () => {
        stdout.close()
        stderr.close()
      },
      (error) => {
        stdout.error(error)
        stderr.error(error)
      },
    )
    const settled = ended.then(
      () => undefined,
      () => undefined,
    )
    return {
      stdout: stdout.stream,
      stderr: stderr.stream,
      wait: () => ended,
      async kill() {
        killed = true
        controller.abort(new Error('killed'))
        await settled
      },
    }
  }

  /**
   * spawn on a live sandbox: a process of the sandbox; with `stdin: true` a `stdin`
   * WritableStream (closing it delivers EOF). kill() sends SIGKILL to its process group
   * (wait() then gives 137); `abortSignal` kills it and wait() rejects with its reason.
   */
  async #spawnLive(rest, withStdin) {
    const live = this.#session.live
    const argv = this.#call(rest, 'spawn option')
    const abortSignal = rest.abortSignal
    abortSignal?.throwIfAborted()
    const options = { workdir: this.#session.workdir, stdin: withStdin }
    if (this.#timeoutMs) options.timeout = this.#timeoutMs / 1000
    const pid = await live.spawn(argv, options)
    const kill = () => live.kill(pid, SIGNALS.SIGKILL).catch(() => {})
    if (abortSignal?.aborted) kill()
    else abortSignal?.addEventListener('abort', kill, { once: true })
    const stdout = byteStream()
    const stderr = byteStream()
    const ended = (async () => {
      for await (const chunk of live.output(pid)) (chunk.stream === 'stdout' ? stdout : stderr).push(chunk.data)
      return live.wait(pid)
    })().then(
      (exit) => {
        if (abortSignal?.aborted) throw abortError(abortSignal)
        return { exitCode: exitCodeOf(exit) }
      },
      (error) => {
        throw abortSignal?.aborted ? abortError(abortSignal) : error
      },
    )
    void ended.finally(() => abortSignal?.removeEventListener('abort', kill)).catch(() => {})
    ended.then(
      () => {
        stdout.close()
        stderr.close()
      },
      (error) => {
        stdout.error(error)
        stderr.error(error)
      },
    )
    const settled = ended.then(
      () => undefined,
      () => undefined,
    )
    const process = {
      pid,
      stdout: stdout.stream,
      stderr: stderr.stream,
      wait: () => ended,
      async kill() {
        await kill()
        await settled
      },
    }
    if (withStdin) {
      process.stdin = new WritableStream({
        write: (chunk) => live.writeStdin(pid, asBytes(chunk, 'a chunk of stdin')),
        close: () => live.closeStdin(pid),
      })
    }
    return process
  }

  #path(options, what, keys = PATH_KEYS) {
    const opts = checkKeys(options, keys, what)
    opts.abortSignal?.throwIfAborted()
    return { ...opts, path: resolveIn(this.#session.workdir, opts.path) }
  }

  /** The file as a byte stream, or `null` when it does not exist. */
  async readFile(options) {
    const bytes = await this.readBinaryFile(options)
    if (bytes === null) return null
    return new ReadableStream({
      start(controller) {
        controller.enqueue(bytes)
        controller.close()
      },
    })
  }

  /** The file's bytes, or `null` when it does not exist. */
  async readBinaryFile(options) {
    const { path } = this.#path(options, 'readBinaryFile option')
    const data = await readOrNull(this.#session, path)
    return data === null ? null : new Uint8Array(data.buffer, data.byteOffset, data.byteLength)
  }

  /** The file as text (`encoding`, default UTF-8), lines `startLine`..`endLine` when given; `null` when missing. */
  async readTextFile(options) {
    const keys = new Set([...PATH_KEYS, 'encoding', 'startLine', 'endLine'])
    const { path, encoding, startLine, endLine } = this.#path(options, 'readTextFile option', keys)
    const data = await readOrNull(this.#session, path)
    if (data === null) return null
    const text = Buffer.from(data.buffer, data.byteOffset, data.byteLength).toString(checkEncoding(encoding ?? 'utf-8'))
    return extractLines(text, startLine, endLine)
  }

  /** Writes a byte stream to a file, creating parent directories and replacing a file. */
  async writeFile(options) {
    const keys = new Set([...PATH_KEYS, 'content'])
    const { path, content, abortSignal } = this.#path(options, 'writeFile option', keys)
    if (!content || typeof content.getReader !== 'function') throw new InvalidRequestError('content must be a ReadableStream')
    const data = await abortable(collect(content), abortSignal)
    await this.#session.writeFile(path, data)
  }

  /** Writes bytes to a file, creating parent directories and replacing a file. */
  async writeBinaryFile(options) {
    const keys = new Set([...PATH_KEYS, 'content'])
    const { path, content } = this.#path(options, 'writeBinaryFile option', keys)
    if (!(content instanceof Uint8Array)) throw new InvalidRequestError('content must be a Uint8Array')
    await this.#session.writeFile(path, content)
  }

  /** Writes text (`encoding`, default UTF-8) to a file, creating parent directories. */
  async writeTextFile(options) {
    const keys = new Set([...PATH_KEYS, 'content', 'encoding'])
    const { path, content, encoding } = this.#path(options, 'writeTextFile option', keys)
    if (typeof content !== 'string') throw new InvalidRequestError('content must be a string')
    await this.#session.writeFile(path, Buffer.from(content, checkEncoding(encoding ?? 'utf-8')))
  }

  /**
   * `{ type, size }` of a path, following a symbolic link (inside the sandbox, where the
   * link is resolved as commands see it); `null` when nothing is there.
   */
  async stat(options) {
    const { path, abortSignal } = this.#path(options, 'stat option')
    const entry = await lookup(this.#session, path)
    if (entry === undefined) {
      // Not decidable from listings (outside the workdir, a closed session, ...): the
      // session's own answer for the path is the error; a listing means a directory.
      await this.#session.listFiles(path)
      return { type: 'directory', size: 0 }
    }
    if (entry === null) return null
    if (entry.kind === 'dir') return { type: 'directory', size: entry.size }
    if (entry.kind === 'file') return { type: 'file', size: entry.size }
    if (entry.kind !== 'symlink') return { type: 'other', size: entry.size }
    const result = await this.#session.run(['stat', '-L', '--printf', '%F\n%s', '--', path], { signal: abortSignal })
    if (result.exitCode !== 0) return null // a dangling link: nothing there to follow to
    const [kind, size] = result.stdout.split('\n')
    const type = kind.startsWith('regular') ? 'file' : kind === 'directory' ? 'directory' : 'other'
    return { type, size: Number(size) }
  }

  /** The entries of a directory (`name`, `type`; links not followed), `null` when it does not exist. */
  async listDirectory(options) {
    const { path } = this.#path(options, 'listDirectory option')
    const entry = await lookup(this.#session, path)
    if (entry === null) return null
    if (entry !== undefined && entry.kind !== 'dir') throw new InvalidRequestError(`${path} is not a directory`)
    const entries = await this.#session.listFiles(path)
    return entries.map((entry) => ({ name: entry.name, type: entry.kind === 'dir' ? 'directory' : entry.kind }))
  }

  /** Deletes a file or link: `true`, or `false` when nothing was there. Rejects for a directory. */
  async deleteFile(options) {
    const { path } = this.#path(options, 'deleteFile option')
    const entry = await lookup(this.#session, path)
    if (entry === null) return false
    if (entry?.kind === 'dir') throw new InvalidRequestError(`${path} is a directory`)
    await this.#session.remove(path)
    return true
  }
}

module.exports = { StrataSandbox, Command, CommandFinished, StrataSandboxSession }
