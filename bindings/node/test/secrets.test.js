'use strict'
// Secrets at egress from Node: `secrets: [{ env, value, hosts }]` converted as the core takes
// it, the value never written back out (capsJson, receipts, error messages), bad input
// refused with invalid_request before anything runs, and one run against a plain-HTTP server
// on the host's loopback that checks the header it got and the placeholder the tool saw.

const { test, describe } = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const http = require('node:http')
const path = require('node:path')

const { Sandbox, Tool, InvalidRequestError } = require('..')
const { tempDir, rejection } = require('./helpers.js')

const native = require(require('../platform.js').addonPath)
const sandbox = new Sandbox()

const VALUE = 's3cr3t-Value-never-read-back'
const NET = 'allow:api.example.com:443'
const secret = (changes = {}) => ({ env: 'API_TOKEN', value: VALUE, hosts: ['api.example.com'], ...changes })

/** The caps as the addon converts and validates them for a run: JSON, or the error. */
function capsJson(caps) {
  const out = native.capsJson(caps)
  return typeof out === 'string' ? { json: out } : { error: out }
}

describe('secrets in the caps object', () => {
  test('round-trip: env and hosts come back, the value never does', () => {
    const { json, error } = capsJson({ net: NET, secrets: [secret()] })
    assert.equal(error, undefined, error?.message)
    assert.ok(!json.includes(VALUE), json)
    assert.deepEqual(JSON.parse(json).secrets, [{ env: 'API_TOKEN', hosts: ['api.example.com'] }])
    assert.equal(JSON.parse(capsJson({}).json).secrets, undefined, 'none by default')
    assert.equal(JSON.parse(capsJson({ secrets: null }).json).secrets, undefined)
    assert.equal(JSON.parse(capsJson({ net: NET, secrets: [] }).json).secrets, undefined)
  })

  const refused = {
    'not an array': [{ net: NET, secrets: 'API_TOKEN@api.example.com' }, /secrets must be an array of \{ env, value, hosts \} objects, got a string/],
    'a bare value': [{ net: NET, secrets: VALUE }, /got a string/],
    'an object, not an array': [{ net: NET, secrets: secret() }, /got an object/],
    'an entry that is not an object': [{ net: NET, secrets: [secret(), VALUE] }, /secrets\[1\] must be an object \{ env, value, hosts \}, got a string/],
    'a missing value': [{ net: NET, secrets: [{ env: 'T', hosts: ['api.example.com'] }] }, /secrets\[0\]: missing field `value`/],
    'a missing env': [{ net: NET, secrets: [secret(), { value: VALUE, hosts: ['a.example.com'] }] }, /secrets\[1\]: missing field `env`/],
    'missing hosts': [{ net: NET, secrets: [{ env: 'T', value: VALUE }] }, /secrets\[0\]: missing field `hosts`/],
    'hosts as a string': [{ net: NET, secrets: [secret({ hosts: 'api.example.com' })] }, /secrets\[0\]: invalid type: string "api.example.com", expected a sequence/],
    'a number for a value': [{ net: NET, secrets: [secret({ value: 42 })] }, /secrets\[0\]: invalid type: .*expected a string/],
    'an unknown key': [{ net: NET, secrets: [secret({ valeu: VALUE })] }, /secrets\[0\]: unknown field `valeu`, expected one of `env`, `value`, `hosts`/],
    'no allowlist': [{ secrets: [secret()] }, /secrets need a network allowlist/],
    'CR/LF in the value': [{ net: NET, secrets: [secret({ value: `${VALUE}\r\nX-Injected: 1` })] }, /no CR, LF/],
    'an address for a host': [{ net: 'allow:192.0.2.7:443', secrets: [secret({ hosts: ['192.0.2.7'] })] }, /is an address/],
    'two secrets in one variable': [{ net: NET, secrets: [secret(), secret()] }, /two secrets use the variable API_TOKEN/],
    'a secret over a caps env variable': [{ net: NET, env: { API_TOKEN: 'x' }, secrets: [secret()] }, /would replace another variable/],
  }
  for (const [name, [caps, message]] of Object.entries(refused)) {
    test(`refused: ${name} (invalid_request, never the value in the message)`, () => {
      const { error } = capsJson(caps)
      assert.ok(error, 'refused')
      assert.equal(error.code, 'invalid_request')
      assert.match(error.message, message)
      assert.ok(!error.message.includes(VALUE), error.message)
      assert.ok(!error.message.includes('X-Injected'), error.message)
    })
  }

  test('a misspelled key names secrets', async () => {
    const error = await rejection(sandbox.run(['true'], { net: NET, secret: [secret()] }))
    assert.ok(error instanceof InvalidRequestError)
    assert.match(error.message, /unknown field `secret`, did you mean `secrets`\?/)
  })

  for (const [name, caps] of [
    ['secrets without an allowlist', { secrets: [secret()] }],
    ['a secret with CR/LF in its value', { net: NET, secrets: [secret({ value: 'v\r\nX-Injected: 1' })] }],
    ['a secret without its value', { net: NET, secrets: [{ env: 'T', hosts: ['api.example.com'] }] }],
  ]) {
    test(`a run with ${name} is refused and nothing runs`, async (t) => {
      const dir = tempDir(t)
      const marker = path.join(dir, 'ran')
      const error = await rejection(sandbox.run(['touch', marker], { readWrite: dir, ...caps }))
      assert.ok(error instanceof InvalidRequestError, `${error.name}: ${error.message}`)
      assert.equal(error.code, 'invalid_request')
      assert.ok(!error.message.includes(VALUE) && !error.message.includes('X-Injected'), error.message)
      assert.equal(fs.existsSync(marker), false, 'nothing ran')
      assert.equal((await sandbox.run(['touch', marker], { readWrite: dir })).exitCode, 0)
      assert.equal(fs.existsSync(marker), true, 'the same tool without the secrets runs')
    })
  }
})

describe('a secret at egress', () => {
  test('reaches a loopback server bound by name; the tool holds a placeholder', async (t) => {
    // Bound to the name `localhost`: the proxy resolves it (the host's /etc/hosts) to
    // 127.0.0.1, a loopback address only an explicit CIDR rule opens.
    const seen = []
    const server = http.createServer((req, res) => {
      const auth = req.headers.authorization ?? ''
      seen.push(auth)
      res.end(auth === `Bearer ${VALUE}` ? 'auth ok' : 'auth bad')
    })
    await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve))
    t.after(() => server.close())
    const { port } = server.address()
    const script = [
      'echo "$TOKEN"',
      `curl -sS -m 10 -H "Authorization: Bearer $TOKEN" http://localhost:${port}/auth; echo`,
      `env | grep -c '${VALUE}' || true`,
    ].join('\n')
    const result = await sandbox.run(Tool.script('sh', script), {
      net: `allow:localhost:${port},127.0.0.1/32:${port}`,
      secrets: [secret({ env: 'TOKEN', hosts: ['localhost'] })],
    })
    assert.equal(result.exitCode, 0, result.stderr)
    const [placeholder, answer, copies] = result.stdout.trim().split('\n')
    assert.match(placeholder, /^strata-secret-/)
    assert.equal(answer, 'auth ok', `${JSON.stringify(seen)} ${JSON.stringify(result.receipt.network)}`)
    assert.equal(copies, '0', 'the value is nowhere in the tool environment')
    assert.deepEqual(seen, [`Bearer ${VALUE}`])
    const sent = result.receipt.network.decisions.filter((d) => d.secrets)
    assert.deepEqual(sent.map((d) => [d.host, d.secrets]), [['localhost', ['TOKEN']]])
    assert.ok(!JSON.stringify(result.receipt).includes(VALUE))
    assert.ok(!result.stdout.includes(VALUE) && !result.stderr.includes(VALUE))
  })
})
