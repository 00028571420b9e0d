'use strict'
// Agent-framework adapters: a generic tool shape ({ name, description, parameters,
// execute }) that any framework taking JSON-Schema tools can use, and its Vercel AI SDK
// form. No dependency on any framework: the AI SDK form is the plain object `tool()`
// from the `ai` package returns, with an input schema `ai` accepts (v5 and later).

const LANGUAGES = { python: 'Python 3', javascript: 'JavaScript (Node.js)', sh: 'POSIX shell' }
const TOOL_OPTIONS = new Set(['sandbox', 'caps', 'name', 'description', 'language'])

// `jsonSchema()` of the `ai` package marks its schemas with this registered symbol.
const AI_SDK_SCHEMA = Symbol.for('vercel.ai.schema')

module.exports = function adapters({ Sandbox, Tool }, checkKeys) {
  function list(paths) {
    if (paths === undefined || paths === null) return []
    return typeof paths === 'string' ? [paths] : Array.from(paths)
  }

  /** What the model should know about the sandbox: visible paths, no network, limits. */
  function describeSandbox(caps) {
    const c = caps ?? {}
    const parts = []
    const ro = list(c.readOnly)
    const rw = list(c.readWrite)
    if (ro.length) parts.push(`Readable paths: ${ro.join(', ')}.`)
    if (rw.length) parts.push(`Writable paths: ${rw.join(', ')}.`)
    if (!ro.length && !rw.length && !(c.mounts && c.mounts.length)) {
      parts.push('No host files are visible.')
    }
    parts.push(c.net === undefined || c.net === 'none' ? 'No network access.' : 'Network access is restricted.')
    parts.push('/tmp is a private scratch directory that is discarded after the run.')
    if (typeof c.timeoutMs === 'number') parts.push(`Runs are stopped after ${c.timeoutMs / 1000} s.`)
    return parts.join(' ')
  }

  function toolOutput(result) {
    return {
      exitCode: result.exitCode,
      signal: result.signal,
      timedOut: result.timedOut,
      limit: result.limit,
      stdout: result.stdout,
      stderr: result.stderr,
      truncated: result.stdoutTruncated || result.stderrTruncated,
    }
  }

  /** A tool that runs model-written code (`{ code }`) in the sandbox. */
  function codeTool(options) {
    const opts = checkKeys(options, TOOL_OPTIONS, 'codeTool option')
    const language = opts.language ?? 'python'
    const sandbox = opts.sandbox ?? new Sandbox()
    const caps = opts.caps
    const languageName = LANGUAGES[language] ?? language
    return {
      name: opts.name ?? `run_${language}`,
      description:
        opts.description ??
        `Run a ${languageName} program in an isolated sandbox and get its exit code, stdout and stderr. ` +
          `Print what you need to stdout. ${describeSandbox(caps)}`,
      parameters: {
        type: 'object',
        properties: { code: { type: 'string', description: `The complete ${languageName} program to run.` } },
        required: ['code'],
        additionalProperties: false,
      },
      async execute(input, execOptions) {
        const result = await sandbox.run(Tool.script(language, input?.code), caps, { signal: execOptions?.signal })
        return toolOutput(result)
      },
    }
  }

  /** A tool that runs a command (`{ argv }`, never a shell string) in the sandbox. */
  function commandTool(options) {
    const opts = checkKeys(options, TOOL_OPTIONS, 'commandTool option')
    if (opts.language !== undefined) {
      throw new TypeError('commandTool takes no language (use codeTool for scripts)')
    }
    const sandbox = opts.sandbox ?? new Sandbox()
    const caps = opts.caps
    return {
      name: opts.name ?? 'run_command',
      description:
        opts.description ??
        'Run a program with arguments in an isolated sandbox and get its exit code, stdout and stderr. ' +
          `The argv is executed directly, without a shell. ${describeSandbox(caps)}`,
      parameters: {
        type: 'object',
        properties: {
          argv: {
            type: 'array',
            items: { type: 'string' },
            minItems: 1,
            description: 'The program and its arguments, e.g. ["ls", "-l", "/data"].',
          },
        },
        required: ['argv'],
        additionalProperties: false,
      },
      async execute(input, execOptions) {
        const result = await sandbox.run(input?.argv, caps, { signal: execOptions?.signal })
        return toolOutput(result)
      },
    }
  }

  /** The Vercel AI SDK form of a sandbox tool: what `tool({ description, inputSchema,
   * execute })` of the `ai` package returns. */
  function aiSdkTool(sandboxTool) {
    const parameters = sandboxTool.parameters
    // Both a schema of `ai`'s jsonSchema() (v5+) and a Standard (JSON) Schema (v6+). Input
    // checking happens in Rust when the tool runs: a bad input rejects with
    // InvalidRequestError, which the SDK reports to the model as a tool error.
    const inputSchema = {
      [AI_SDK_SCHEMA]: true,
      _type: undefined,
      jsonSchema: parameters,
      validate: (value) => ({ success: true, value }),
      '~standard': {
        version: 1,
        vendor: 'strata-sandbox',
        validate: (value) => ({ value }),
        jsonSchema: { input: () => parameters, output: () => parameters },
      },
    }
    return {
      description: sandboxTool.description,
      inputSchema,
      execute: (input, options) => sandboxTool.execute(input, { signal: options?.abortSignal }),
    }
  }

  return { codeTool, commandTool, aiSdkTool }
}
