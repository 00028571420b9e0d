'use strict'
// index.d.ts matches the exports: every value it declares exists with the declared kind,
// and nothing is exported that it does not declare. (The types themselves are checked by
// `tsc -p tsconfig.json` over test/types.ts and the example.)

const { test } = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const path = require('node:path')
const ts = require('typescript')

const strata = require('..')

function declaredValues() {
  const file = path.join(__dirname, '..', 'index.d.ts')
  const source = ts.createSourceFile(file, fs.readFileSync(file, 'utf8'), ts.ScriptTarget.ES2022, true)
  const values = new Map()
  for (const statement of source.statements) {
    const exported = ts.getCombinedModifierFlags(statement) & ts.ModifierFlags.Export
    if (!exported) continue
    if (ts.isClassDeclaration(statement)) values.set(statement.name.text, 'class')
    else if (ts.isFunctionDeclaration(statement)) values.set(statement.name.text, 'function')
    else if (ts.isVariableStatement(statement)) {
      for (const d of statement.declarationList.declarations) values.set(d.name.getText(source), 'const')
    }
  }
  return values
}

test('index.d.ts declares exactly the runtime exports', () => {
  const declared = declaredValues()
  assert.deepEqual([...declared.keys()].sort(), Object.keys(strata).sort())
  for (const [name, kind] of declared) {
    const value = strata[name]
    if (kind === 'class') {
      assert.equal(typeof value, 'function', name)
      assert.ok(value.prototype, `${name} is a class`)
    } else if (kind === 'function') {
      assert.equal(typeof value, 'function', name)
    } else {
      assert.notEqual(typeof value, 'function', `${name} is a value`)
      assert.notEqual(value, undefined, name)
    }
  }
})

test('ES modules get the same named exports', async () => {
  const esm = await import('strata-sandbox')
  for (const name of Object.keys(strata)) assert.equal(esm[name], strata[name], name)
})

test('the package files list ships what index.js loads', () => {
  const { files, main, types } = require('../package.json')
  for (const needed of [main, types, 'adapters.js', 'platform.js', 'scripts/build.js']) {
    assert.ok(files.includes(needed), needed)
  }
})
