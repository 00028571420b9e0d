'use strict'
// The agent-framework adapters: the generic tool shape, and the Vercel AI SDK tool checked
// with the real `ai` package (its schema handling, `tool()`, and a full `generateText`
// agent loop driven by the SDK's mock model: no network, no model calls).

const { test, describe } = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const path = require('node:path')

const { Sandbox, codeTool, commandTool, aiSdkTool, InvalidRequestError } = require('..')
const { tempDir, rejection } = require('./helpers.js')

describe('generic tool shape', () => {
  test('codeTool: name, description, JSON Schema, execute', async (t) => {
    const dir = tempDir(t)
    fs.writeFileSync(path.join(dir, 'numbers.txt'), '1\n2\n3\n')
    const python = codeTool({ caps: { readOnly: dir, timeoutMs: 10_000 } })
    assert.equal(python.name, 'run_python')
    assert.match(python.description, /Python 3/)
    assert.match(python.description, new RegExp(`Readable paths: ${dir}`))
    assert.match(python.description, /No network access/)
    assert.deepEqual(python.parameters, {
      type: 'object',
      properties: { code: { type: 'string', description: 'The complete Python 3 program to run.' } },
      required: ['code'],
      additionalProperties: false,
    })
    const output = await python.execute({ code: `print(sum(int(x) for x in open("${dir}/numbers.txt")))` })
    assert.deepEqual(output, {
      exitCode: 0,
      signal: null,
      timedOut: false,
      limit: null,
      stdout: '6\n',
      stderr: '',
      truncated: false,
    })
  })

  test('codeTool: a failing program is data for the model', async () => {
    const output = await codeTool().execute({ code: 'raise SystemExit("nope")' })
    assert.equal(output.exitCode, 1)
    assert.match(output.stderr, /nope/)
  })

  test('codeTool: other languages, custom name and description', async () => {
    const js = codeTool({ language: 'javascript', name: 'js', description: 'Runs JS.' })
    assert.equal(js.name, 'js')
    assert.equal(js.description, 'Runs JS.')
    assert.equal((await js.execute({ code: 'console.log([1, 2].length)' })).stdout, '2\n')
    const sh = codeTool({ language: 'sh', sandbox: new Sandbox({ backend: 'process' }) })
    assert.equal(sh.name, 'run_sh')
    assert.equal((await sh.execute({ code: 'echo $((6 * 7))' })).stdout, '42\n')
  })

  test('codeTool: malformed input rejects with invalid_request', async () => {
    for (const input of [{}, { code: 42 }, null, undefined]) {
      const error = await rejection(codeTool().execute(input))
      assert.ok(error instanceof InvalidRequestError, `${JSON.stringify(input)}: ${error.message}`)
    }
  })

  test('codeTool: the signal kills the sandbox', async () => {
    const error = await rejection(
      codeTool({ language: 'sh' }).execute({ code: 'sleep 1000' }, { signal: AbortSignal.timeout(200) }),
    )
    assert.equal(error.code, 'cancelled')
  })

  test('commandTool: argv, no shell', async () => {
    const cmd = commandTool({ caps: { env: { WHO: 'sandbox' } } })
    assert.equal(cmd.name, 'run_command')
    assert.deepEqual(cmd.parameters.required, ['argv'])
    const output = await cmd.execute({ argv: ['sh', '-c', 'echo hi $WHO'] })
    assert.equal(output.stdout, 'hi sandbox\n')
    const literal = await cmd.execute({ argv: ['echo', '$WHO; rm -rf /'] })
    assert.equal(literal.stdout, '$WHO; rm -rf /\n')
    const error = await rejection(cmd.execute({ argv: 'ls -l' }))
    assert.equal(error.code, 'invalid_request')
  })

  test('unknown tool options are rejected', () => {
    assert.throws(() => codeTool({ langauge: 'sh' }), InvalidRequestError)
    assert.throws(() => commandTool({ language: 'sh' }), TypeError)
  })
})

describe('Vercel AI SDK (the real `ai` package)', () => {
  const ai = require('ai')
  const { MockLanguageModelV3 } = require('ai/test')

  test('tool() accepts it and the SDK reads its JSON Schema', async () => {
    const sandboxTool = codeTool()
    const python = ai.tool(aiSdkTool(sandboxTool))
    assert.equal(python.description, sandboxTool.description)
    const schema = ai.asSchema(python.inputSchema)
    assert.deepEqual(await schema.jsonSchema, sandboxTool.parameters)
    const validated = await schema.validate({ code: 'print(1)' })
    assert.deepEqual(validated, { success: true, value: { code: 'print(1)' } })
  })

  test('execute runs in the sandbox, and abortSignal kills it', async () => {
    const python = ai.tool(aiSdkTool(codeTool()))
    const output = await python.execute({ code: 'print("from the sdk")' }, { toolCallId: 'call-1', messages: [] })
    assert.equal(output.stdout, 'from the sdk\n')
    const shell = aiSdkTool(codeTool({ language: 'sh' }))
    const error = await rejection(
      shell.execute({ code: 'sleep 1000' }, { toolCallId: 'call-2', messages: [], abortSignal: AbortSignal.timeout(200) }),
    )
    assert.equal(error.code, 'cancelled')
  })

  test('a generateText agent loop calls the sandboxed tool and feeds the result back', async () => {
    const usage = {
      inputTokens: { total: 1, noCache: 1, cacheRead: undefined, cacheWrite: undefined },
      outputTokens: { total: 1, text: 1, reasoning: undefined },
    }
    const seenToolResults = []
    const model = new MockLanguageModelV3({
      doGenerate: async ({ prompt }) => {
        const toolMessage = prompt.find((m) => m.role === 'tool')
        if (!toolMessage) {
          return {
            content: [
              {
                type: 'tool-call',
                toolCallId: 'call-1',
                toolName: 'python',
                input: JSON.stringify({ code: 'import math\nprint(math.factorial(10))' }),
              },
            ],
            finishReason: { unified: 'tool-calls', raw: undefined },
            usage,
            warnings: [],
          }
        }
        seenToolResults.push(toolMessage.content[0].output)
        return {
          content: [{ type: 'text', text: 'The answer is 3628800.' }],
          finishReason: { unified: 'stop', raw: undefined },
          usage,
          warnings: [],
        }
      },
    })
    const result = await ai.generateText({
      model,
      prompt: 'What is 10!? Use Python.',
      tools: { python: aiSdkTool(codeTool({ caps: { timeoutMs: 10_000 } })) },
      stopWhen: ai.stepCountIs(3),
    })
    assert.equal(result.text, 'The answer is 3628800.')
    const toolResult = result.steps[0].toolResults[0]
    assert.equal(toolResult.toolName, 'python')
    assert.equal(toolResult.output.stdout, '3628800\n')
    assert.equal(toolResult.output.exitCode, 0)
    assert.equal(seenToolResults.length, 1)
    assert.equal(seenToolResults[0].type, 'json')
    assert.equal(seenToolResults[0].value.stdout, '3628800\n')
  })

  test('a refused run reaches the model as a tool error', async () => {
    const usage = {
      inputTokens: { total: 1, noCache: 1, cacheRead: undefined, cacheWrite: undefined },
      outputTokens: { total: 1, text: 1, reasoning: undefined },
    }
    let calls = 0
    const model = new MockLanguageModelV3({
      doGenerate: async () => {
        calls += 1
        if (calls === 1) {
          return {
            content: [{ type: 'tool-call', toolCallId: 'c', toolName: 'cmd', input: JSON.stringify({ argv: [] }) }],
            finishReason: { unified: 'tool-calls', raw: undefined },
            usage,
            warnings: [],
          }
        }
        return { content: [{ type: 'text', text: 'ok' }], finishReason: { unified: 'stop', raw: undefined }, usage, warnings: [] }
      },
    })
    const result = await ai.generateText({
      model,
      prompt: 'run nothing',
      tools: { cmd: aiSdkTool(commandTool()) },
      stopWhen: ai.stepCountIs(3),
    })
    const errorPart = result.steps[0].content.find((part) => part.type === 'tool-error')
    assert.ok(errorPart, JSON.stringify(result.steps[0].content))
    assert.equal(errorPart.error.code, 'invalid_request')
  })
})
