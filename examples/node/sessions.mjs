// A session: a sandbox whose files live across calls.
// Run: node examples/node/sessions.mjs   (after: npm install ./bindings/node)
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { Sandbox } from 'strata-sandbox'

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'strata-example-'))
fs.mkdirSync(path.join(tmp, 'project'))
fs.writeFileSync(path.join(tmp, 'project', 'data.csv'), 'region,sales\nnorth,120\nsouth,80\nnorth,145\n')

const sandbox = new Sandbox()
// Caps as for any run: no host files, no network, limits on everything.
const s = sandbox.session({ timeoutMs: 20_000, memory: '256M' })
try {
  console.log(`session workdir ${s.workdir}`)
  const up = await s.upload(path.join(tmp, 'project'), 'project')
  console.log(`uploaded ${up.files} files, ${up.bytes} bytes`)
  await s.writeFile('stats.py', [
    'import csv, os',
    "rows = list(csv.DictReader(open('project/data.csv')))",
    "os.makedirs('report', exist_ok=True)",
    "open('report/total.txt', 'w').write(str(sum(int(r['sales']) for r in rows)))",
    "print('rows', len(rows))",
  ].join('\n'))
  // Each call is one sandbox run: its processes end with it, its files stay.
  const first = await s.run(['/usr/bin/python3', 'stats.py'])
  console.log('call 1:', first.stdout.trim())
  const second = await s.run(['cat', 'report/total.txt'])
  console.log("call 2 reads call 1's file:", second.stdout)
  // A per-call timeout (0 would mean none), and streamed output.
  const slow = await s.run(['sleep', '5'], { timeoutMs: 500 })
  console.log('call 3 timed out:', slow.timedOut)
  const chunks = []
  await s.run(['/bin/sh', '-c', 'echo streamed'], { onStdout: (c) => chunks.push(c) })
  console.log('streamed:', Buffer.concat(chunks).toString().trim())
  console.log('files:', (await s.listFiles()).map((e) => `${e.name}(${e.kind})`).join(' '))
  await s.download('report', path.join(tmp, 'report'))
  console.log('downloaded total:', fs.readFileSync(path.join(tmp, 'report', 'total.txt'), 'utf8'))
} finally {
  await s.close() // removes the session's directory; calls in flight are cancelled
  fs.rmSync(tmp, { recursive: true, force: true })
}
console.log('closed:', s.closed)
