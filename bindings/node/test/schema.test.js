'use strict'
// index.d.ts against the committed JSON Schema (schema/*.schema.json, generated from the Rust
// core), read with the TypeScript compiler API: `Caps` declares exactly the Node names of the
// table the caps schema carries (x-strata-names), its legacy spellings only as @deprecated;
// `Mount` and `Receipt` have exactly their schema fields; and every enum of the schemas is an
// exported union of string literals with exactly its values (LimitKind has 'open_files').
// Then the runtime side: every spelling is accepted, and an unknown key names the closest.

const { test, describe } = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const path = require('node:path')
const ts = require('typescript')

const ROOT = path.resolve(__dirname, '..', '..', '..')
const DTS = path.resolve(__dirname, '..', 'index.d.ts')
const load = (name) => JSON.parse(fs.readFileSync(path.join(ROOT, 'schema', name), 'utf8'))
const CAPS = load('caps.schema.json')
const OUTPUT = load('run-output.schema.json')

/** Enums of the schemas the Node API does not expose, with why. */
const NOT_EXPOSED = {
  TrapKind: 'RunResult has no trap property',
}

/** The definitions of `schema` that are enums of strings, with their values. */
function stringEnums(schema) {
  const out = {}
  for (const [name, def] of Object.entries(schema.$defs ?? {})) {
    if (Array.isArray(def.enum) && def.enum.every((v) => typeof v === 'string')) {
      out[name] = new Set(def.enum)
    } else if (Array.isArray(def.oneOf) && def.oneOf.every((o) => typeof o.const === 'string')) {
      out[name] = new Set(def.oneOf.map((o) => o.const))
    }
  }
  return out
}

/** Interfaces (members, with whether each is @deprecated) and type aliases of a .d.ts text. */
function declarations(text) {
  const source = ts.createSourceFile('index.d.ts', text, ts.ScriptTarget.Latest, true)
  const interfaces = new Map()
  const aliases = new Map()
  for (const statement of source.statements) {
    if (ts.isInterfaceDeclaration(statement)) {
      const members = new Map()
      for (const member of statement.members) {
        if (!member.name) continue
        const deprecated = ts.getJSDocTags(member).some((tag) => tag.tagName.text === 'deprecated')
        members.set(member.name.getText(source), { deprecated })
      }
      interfaces.set(statement.name.text, members)
    } else if (ts.isTypeAliasDeclaration(statement)) {
      aliases.set(statement.name.text, statement.type)
    }
  }
  /** The string literals of alias `name` (following references to other aliases), or null. */
  function literals(name, seen = new Set()) {
    const node = aliases.get(name)
    if (!node || seen.has(name)) return null
    seen.add(name)
    const values = new Set()
    const visit = (type) => {
      if (ts.isUnionTypeNode(type)) return type.types.every(visit)
      if (ts.isParenthesizedTypeNode(type)) return visit(type.type)
      if (ts.isLiteralTypeNode(type) && ts.isStringLiteral(type.literal)) {
        values.add(type.literal.text)
        return true
      }
      if (ts.isTypeReferenceNode(type) && ts.isIdentifier(type.typeName)) {
        const inner = literals(type.typeName.text, seen)
        if (!inner) return false
        for (const v of inner) values.add(v)
        return true
      }
      return false
    }
    return visit(node) ? values : null
  }
  return { interfaces, literals }
}

/** Every difference between a .d.ts text and the schemas (empty when they agree). */
function problems(text) {
  const out = []
  const { interfaces, literals } = declarations(text)
  const compare = (what, declared, expected) => {
    const extra = [...declared].filter((k) => !expected.has(k)).sort()
    const missing = [...expected].filter((k) => !declared.has(k)).sort()
    if (extra.length) out.push(`${what}: not in the schema: ${extra.join(', ')}`)
    if (missing.length) out.push(`${what}: missing: ${missing.join(', ')}`)
  }
  const table = CAPS['x-strata-names']
  const caps = interfaces.get('Caps') ?? new Map()
  const names = new Set(table.caps.map((row) => row.node).filter(Boolean))
  const legacy = new Set(
    table.caps.flatMap((row) => row.aliases.filter((a) => a.dialect === 'node').map((a) => a.name)),
  )
  compare('Caps', new Set(caps.keys()), new Set([...names, ...legacy]))
  for (const [key, { deprecated }] of caps) {
    if (legacy.has(key) && !deprecated) out.push(`Caps.${key}: a legacy spelling, must be @deprecated`)
    if (names.has(key) && deprecated) out.push(`Caps.${key}: the current name, must not be @deprecated`)
  }
  const mount = interfaces.get('Mount') ?? new Map()
  compare('Mount', new Set(mount.keys()), new Set(table.mount.map((row) => row.node).filter(Boolean)))
  const options = interfaces.get('SandboxOptions') ?? new Map()
  for (const row of table.options) {
    if (row.node && !options.has(row.node)) out.push(`SandboxOptions: missing: ${row.node}`)
  }
  const receipt = interfaces.get('Receipt') ?? new Map()
  compare('Receipt', new Set(receipt.keys()), new Set(Object.keys(OUTPUT.$defs.Receipt.properties)))
  const enums = { ...stringEnums(CAPS), ...stringEnums(OUTPUT) }
  for (const [name, values] of Object.entries(enums).sort()) {
    if (name in NOT_EXPOSED) continue
    const declared = literals(name)
    if (!declared) out.push(`type ${name}: not declared as a union of string literals`)
    else compare(`type ${name}`, declared, values)
  }
  return out
}

describe('index.d.ts matches the schema', () => {
  const text = fs.readFileSync(DTS, 'utf8')

  test('Caps, Mount, Receipt and every enum agree with schema/', () => {
    assert.deepEqual(problems(text), [], 'index.d.ts disagrees with schema/ (generated from sandbox-core)')
  })

  test("LimitKind has 'open_files' (the schema's, and the declared one)", () => {
    assert.ok(stringEnums(OUTPUT).LimitKind.has('open_files'))
    assert.ok(declarations(text).literals('LimitKind').has('open_files'))
  })

  test('the egress receipt: EgressRefusal, the budgets in LimitKind, proxy in Mechanism, Receipt.network', () => {
    const { interfaces, literals } = declarations(text)
    assert.deepEqual(
      [...literals('EgressRefusal')].sort(),
      ['bad_request', 'budget', 'connect_failed', 'policy', 'unresolvable'],
    )
    assert.ok(literals('LimitKind').has('egress_bytes') && literals('LimitKind').has('egress_connections'))
    assert.ok(literals('Mechanism').has('proxy'))
    assert.ok(interfaces.get('Receipt').has('network'))
    for (const [name, def] of [
      ['NetworkReceipt', OUTPUT.$defs.NetworkReceipt],
      ['EgressDecision', OUTPUT.$defs.EgressDecision],
    ]) {
      assert.deepEqual([...interfaces.get(name).keys()].sort(), Object.keys(def.properties).sort(), name)
    }
  })

  test('a declaration that drifted is caught', () => {
    const broken = text
      .replace("  | 'open_files'\n  | 'egress_bytes'\n", "  | 'egress_bytes'\n")
      .replace('  output?: ByteSize\n', '  outputBytes?: ByteSize\n')
      .replace('   * @deprecated Use `output`.\n', '')
      .replace("export type IdentitySource = 'agent' | 'fresh' | 'embedder'", 'export type IdentitySource = string')
      .replace("| 'connect_failed' | 'budget'\n", "| 'connect_failed'\n")
    assert.notEqual(broken, text)
    const found = problems(broken)
    for (const expected of [
      'type LimitKind: missing: open_files',
      'Caps: not in the schema: outputBytes',
      'Caps: missing: output',
      'Caps.maxOutput: a legacy spelling, must be @deprecated',
      'type IdentitySource: not declared as a union of string literals',
      'type EgressRefusal: missing: budget',
    ]) {
      assert.ok(found.includes(expected), `${expected} not in ${JSON.stringify(found, null, 1)}`)
    }
  })
})

describe('caps keys at run time', () => {
  const { Sandbox, InvalidRequestError } = require('..')
  const { rejection } = require('./helpers.js')
  const sandbox = new Sandbox()

  test('output and its legacy spelling maxOutput cap the output alike', async () => {
    for (const caps of [{ output: '4K' }, { maxOutput: '4K' }]) {
      const result = await sandbox.run(['yes'], caps)
      assert.equal(result.limit, 'output', JSON.stringify(caps))
      assert.ok(result.stdout.length <= 4096)
    }
  })

  test('giving a field twice under two spellings is refused', async () => {
    const error = await rejection(sandbox.run(['true'], { output: '4K', maxOutput: '8K' }))
    assert.ok(error instanceof InvalidRequestError)
    assert.match(error.message, /`output` and `maxOutput` are the same field/)
  })

  for (const [key, suggestion] of [
    ['max_output', 'output'],
    ['timeout', 'timeoutMs'],
    ['read_only', 'readOnly'],
    ['openfiles', 'openFiles'],
    ['egressByte', 'egressBytes'],
    ['egress_bytes', 'egressBytes'],
    ['egress_connections', 'egressConnections'],
  ]) {
    test(`an unknown key ${key} names ${suggestion}`, async () => {
      const error = await rejection(sandbox.run(['true'], { [key]: 1 }))
      assert.ok(error instanceof InvalidRequestError)
      assert.match(error.message, new RegExp(`unknown field \`${key}\`, did you mean \`${suggestion}\`\\?`))
    })
  }

  test('egressBytes and egressConnections set the egress budgets (as the shared schema has them)', () => {
    // The addon's test probe: the caps converted and validated as `run` takes them.
    const native = require(require('../platform.js').addonPath)
    const json = (caps) => {
      const out = native.capsJson(caps)
      if (typeof out !== 'string') throw new Error(`${out.code}: ${out.message}`)
      return JSON.parse(out)
    }
    const defaults = json({}).limits
    assert.equal(defaults.egress_bytes, 1 << 30)
    assert.equal(defaults.egress_connections, 1024)
    const limits = json({ egressBytes: '100M', egressConnections: 8 }).limits
    assert.equal(limits.egress_bytes, 100 * (1 << 20))
    assert.equal(limits.egress_connections, 8)
    assert.equal(json({ egressBytes: 4096 }).limits.egress_bytes, 4096)
    assert.deepEqual(json({ egressBytes: undefined, egressConnections: null }).limits, defaults)
    for (const bad of [{ egressBytes: 'lots' }, { egressConnections: -1 }, { egressConnections: '8' }]) {
      const out = native.capsJson(bad)
      assert.equal(out.code, 'invalid_request', JSON.stringify(bad))
    }
  })

  test('runs take the egress budgets', async () => {
    const result = await sandbox.run(['true'], { egressBytes: '1M', egressConnections: 4 })
    assert.equal(result.exitCode, 0)
    assert.equal(result.receipt.network, undefined, 'no allowlist, no egress decisions')
    const error = await rejection(sandbox.run(['true'], { egressBytes: 'lots' }))
    assert.ok(error instanceof InvalidRequestError)
    assert.match(error.message, /lots/)
  })

  test('an unknown mount key names the closest', async () => {
    const error = await rejection(sandbox.run(['true'], { mounts: [{ host: '/etc', follow_symlinks: true }] }))
    assert.match(error.message, /unknown field `follow_symlinks`, did you mean `followSymlinks`\?/)
  })
})
