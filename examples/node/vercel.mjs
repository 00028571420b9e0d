// Vercel's sandbox shapes on a Strata session: code written for @vercel/sandbox or for the
// AI SDK's experimental_sandbox runs locally, confined, with no cloud account.
// Run: node examples/node/vercel.mjs   (after: npm install ./bindings/node)
import { StrataSandbox, StrataSandboxSession } from 'strata-sandbox/vercel'

// The @vercel/sandbox Sandbox shape.
const sandbox = await StrataSandbox.create({ caps: { timeoutMs: 60_000 } })
try {
  await sandbox.writeFiles([{ path: 'main.py', content: Buffer.from('print(6 * 7)') }])
  const done = await sandbox.runCommand('python3', ['main.py'])
  console.log('runCommand:', done.exitCode, (await done.stdout()).trim())

  // Spawn with streams, then kill: the whole call ends, nothing it started survives.
  const cmd = await sandbox.runCommand({ cmd: 'sh', args: ['-c', 'echo started; sleep 30'], detached: true })
  for await (const line of cmd.logs()) {
    console.log(`detached ${line.stream}:`, line.data.trim())
    break
  }
  await cmd.kill()
  console.log('after kill, exit code:', (await cmd.wait()).exitCode)

  // The AI SDK's Experimental_SandboxSession shape (pass it as `experimental_sandbox`).
  const session = new StrataSandboxSession(sandbox)
  const ran = await session.run({ command: 'echo $((6 * 7)) > answer.txt && cat answer.txt' })
  console.log('session.run:', ran.exitCode, ran.stdout.trim())
  console.log('readTextFile:', (await session.readTextFile({ path: 'answer.txt' }))?.trim())
  console.log('missing file:', await session.readTextFile({ path: 'nope.txt' }))
} finally {
  await sandbox.stop()
}
