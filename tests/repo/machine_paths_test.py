"""No tracked file names an absolute path of one machine: the checkout's own location,
the folder it sits in (where sibling checkouts and shared data live on our machines),
or our machines' work folder. Generated reports count too: a report committed from a
machine must name its paths relative to the checkout. Binary files are not read."""
import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
# NOTE: our machines keep the checkouts and the shared data folder under one work
# folder; it is flagged wherever this checkout is. Spelt in two parts so that this file
# does not name it.
WORK_FOLDER = "/" + "work"
# Folders any machine has: a checkout directly inside one of them does not make the
# folder itself one machine's path.
GENERIC = {"/", "/tmp", "/var/tmp", "/home", "/root", "/opt", "/usr", "/usr/local", "/srv", "/mnt", "/media",
           "/var", "/run", "/workspace"}


def machine_paths(root):
    """The absolute paths that belong to the machine holding the checkout `root`."""
    return sorted({root, os.path.dirname(root), WORK_FOLDER} - GENERIC)


def machine_path_pattern(paths):
    # A path counts where it is not part of a longer name: not after a name character or
    # a slash (libs/worker), not followed by more of a name (/worker, /work-old, /work.d).
    # The match runs on to the end of the path, for the message.
    names = "|".join(re.escape(p) for p in sorted(paths, key=len, reverse=True))
    return re.compile(rb"(?<![\w.~$/-])(?:" + names.encode() + rb")(?![\w-]|\.\w)(?:/[^\s\"'`<>()\[\]{},;|]*)?")


def tracked_files(root):
    p = subprocess.run(["git", "-C", root, "ls-files", "-z"], capture_output=True, check=True)
    return [f for f in p.stdout.decode().split("\0") if f]


def findings(root, files, paths):
    """'FILE:LINE: PATH' for each machine path in the text files (and symlink targets) of
    `files`, relative to `root`."""
    pattern = machine_path_pattern(paths)
    out = []
    for rel in files:
        full = os.path.join(root, rel)
        if os.path.islink(full):
            data = os.readlink(full).encode()
        elif os.path.isfile(full):
            with open(full, "rb") as f:
                data = f.read()
        else:
            continue  # deleted in the working tree
        if b"\0" in data:
            continue  # binary: weights, GGUF, fuzz inputs
        for m in pattern.finditer(data):
            line = data.count(b"\n", 0, m.start()) + 1
            out.append(f"{rel}:{line}: {m.group().decode(errors='replace')}")
    return out


def test_no_tracked_file_names_a_path_of_this_machine():
    found = findings(ROOT, tracked_files(ROOT), machine_paths(ROOT))
    assert not found, "absolute paths of one machine (name them relative to the checkout):\n" + "\n".join(found)


def test_machine_paths_are_the_checkout_its_folder_and_the_work_folder():
    assert machine_paths("/home/ci/src/kvmesh") == ["/home/ci/src", "/home/ci/src/kvmesh", WORK_FOLDER]
    # A checkout directly in /tmp or a home folder: /tmp and /home are every machine's.
    assert machine_paths("/tmp/kvmesh") == ["/tmp/kvmesh", WORK_FOLDER]
    assert machine_paths(WORK_FOLDER + "/main") == [WORK_FOLDER, WORK_FOLDER + "/main"]


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def test_finds_the_checkout_its_siblings_and_the_shared_folder(tmp_path):
    root = str(tmp_path / "machine" / "checkout")
    parent = os.path.dirname(root)
    write(f"{root}/docs/report.txt", f"ok\nsource_dir={root}\nbinary_dir={root}/build\n".encode())
    write(f"{root}/tools/script", f'default="{parent}/shared/data/tokenizers"\n'.encode())
    write(f"{root}/tests/util.h", f'return "{WORK_FOLDER}/shared/data";\n'.encode())
    os.symlink(f"{root}/build/models", f"{root}/models")
    found = findings(root, ["docs/report.txt", "tools/script", "tests/util.h", "models"], machine_paths(root))
    assert found == [f"docs/report.txt:2: {root}", f"docs/report.txt:3: {root}/build",
                     f"tools/script:1: {parent}/shared/data/tokenizers", f"tests/util.h:1: {WORK_FOLDER}/shared/data",
                     f"models:1: {root}/build/models"]


def test_generic_paths_and_lookalike_names_are_not_flagged(tmp_path):
    root = str(tmp_path / "machine" / "checkout")
    parent = os.path.dirname(root)
    text = ("/usr/local/cuda/lib64 /tmp/kvmesh-gpu-pack /proc/self/status /opt/kvmesh/bin /var/tmp/x /dev/shm\n"
            f"libs/worker/worker.h services{WORK_FOLDER}er {WORK_FOLDER}er {WORK_FOLDER}-old {WORK_FOLDER}.d "
            f"~{WORK_FOLDER}/x {parent}-backup/x\n")
    write(f"{root}/notes.md", text.encode())
    assert findings(root, ["notes.md"], machine_paths(root)) == []


def test_binary_files_are_not_read(tmp_path):
    root = str(tmp_path / "checkout")
    write(f"{root}/model.gguf", b"GGUF\0\1\2" + f"{root}/build/models".encode() + b"\0")
    write(f"{root}/text.txt", f"{root}/build/models".encode())
    assert findings(root, ["model.gguf", "text.txt"], machine_paths(root)) == [f"text.txt:1: {root}/build/models"]
