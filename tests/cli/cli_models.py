"""Test inputs for the CLI tests, made at test time from the shared stories260K GGUF: a variant
with a longer context and a chat template (so `chat`, `generate --chat` and the server's chat
route run on a 1 MB model at ~1000 tok/s), folders of GGUFs, and a fake Hugging Face hub cache
laid out the way huggingface_hub writes it (refs/main, snapshots/REV/ of symlinks into blobs/)."""
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

BIN = os.environ["LARDER_BIN"]
SHARED = os.environ["LARDER_SHARED_DIR"]
STORIES = os.path.join(SHARED, "models/stories260K/stories260K.gguf")
TINY_RANDOM = os.path.join(SHARED, "models/llama-2-tiny-random/llama-2-tiny-random.gguf")

# The user message, then the story opening as the assistant's start: the answer is a story.
STORY_TEMPLATE = ("{{ bos_token }}{% for m in messages %}"
                  "{% if m['role'] == 'assistant' %}Once upon a time{% endif %}{{ m['content'] }}\n{% endfor %}"
                  "{% if add_generation_prompt %}Once upon a time{% endif %}")


def run(*args, timeout=120, input=None, env=None):
    p = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=timeout, errors="replace",
                       input=input, env=env, stdin=None if input is not None else subprocess.DEVNULL)
    return p.returncode, p.stdout, p.stderr


def stories_variant(path, context=None, chat_template=None):
    """stories260K.gguf with llama.context_length and/or tokenizer.chat_template replaced."""
    import gguf
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata
    reader = gguf.GGUFReader(STORIES)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(path, arch=arch, endianess=reader.endianess)
    new = {}
    if context:
        new[f"{arch}.context_length"] = MetadataDetails(gguf.GGUFValueType.UINT32, context)
    if chat_template:
        new[gguf.Keys.Tokenizer.CHAT_TEMPLATE] = MetadataDetails(gguf.GGUFValueType.STRING, chat_template)
    devnull = open(os.devnull, "w")
    old, sys.stdout = sys.stdout, devnull  # the writer's progress bar
    old_err, sys.stderr = sys.stderr, devnull
    try:
        copy_with_new_metadata(reader, writer, new, [])
    finally:
        sys.stdout, sys.stderr = old, old_err
        devnull.close()
    return path


def story_chat_model(tmp, context=4096):
    return stories_variant(os.path.join(tmp, f"stories-chat-{context}.gguf"), context, STORY_TEMPLATE)


def fake_hub(root, repo, files, rev="0123456789abcdef0123456789abcdef01234567"):
    """A hub cache entry for `repo` whose snapshot holds `files` ({name: source path}), each a
    symlink into blobs/ as huggingface_hub makes them. Returns the hub folder (HF_HUB_CACHE)."""
    hub = os.path.join(root, "hub")
    entry = os.path.join(hub, "models--" + repo.replace("/", "--"))
    snap = os.path.join(entry, "snapshots", rev)
    os.makedirs(snap, exist_ok=True)
    os.makedirs(os.path.join(entry, "blobs"), exist_ok=True)
    os.makedirs(os.path.join(entry, "refs"), exist_ok=True)
    with open(os.path.join(entry, "refs", "main"), "w") as f:
        f.write(rev)
    for i, (name, src) in enumerate(sorted(files.items())):
        blob = os.path.join(entry, "blobs", f"blob{i:04d}")
        if os.path.isdir(src):
            shutil.copytree(src, os.path.join(snap, name))
            continue
        shutil.copyfile(src, blob)
        os.symlink(os.path.relpath(blob, snap), os.path.join(snap, name))
    return hub


def hub_env(hub):
    env = dict(os.environ)
    env.pop("HF_HOME", None)
    env["HF_HUB_CACHE"] = hub
    return env


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Serve:
    """`larder serve` on a free loopback port, healthy when constructed."""

    def __init__(self, model, *flags, env=None):
        self.port = free_port()
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([BIN, "serve", model, "--port", str(self.port), *flags],
                                     stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=env)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited: {self.output()}")
            try:
                if self.get("/health")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise AssertionError(f"serve not healthy: {self.output()}")

    def output(self):
        self.log.seek(0)
        return self.log.read().decode("utf-8", "replace")

    def get(self, path):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            c.request("GET", path)
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def post(self, path, body):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            r = c.getresponse()
            data = r.read()
            assert r.status == 200, f"{path}: {r.status} {data[:500]!r}"
            return json.loads(data)
        finally:
            c.close()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
