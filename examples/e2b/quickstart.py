"""E2B's quickstart, unmodified: it runs against `strata serve --e2b` when the environment
points the SDK there (nothing in the code names Strata):

    strata serve --e2b 127.0.0.1:3000 --api-key "$KEY" &
    E2B_API_URL=http://127.0.0.1:3000 E2B_SANDBOX_URL=http://127.0.0.1:3000 \
    E2B_API_KEY="$KEY" python3 examples/e2b/quickstart.py
"""

from e2b import Sandbox

sandbox = Sandbox.create()

sandbox.files.write("/home/user/hello.py", "print('hello from the sandbox')")
execution = sandbox.commands.run("python3 /home/user/hello.py")
print(execution.stdout, end="")

files = sandbox.files.list("/home/user")
print([f.name for f in files])

sandbox.kill()
