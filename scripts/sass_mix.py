"""Static instruction mix of the sm90 forward kernel, per source function: no GPU needed.

    python scripts/sass_mix.py [OBJECT] [--dim 128|64] [--kernel 1|2|4|8] [--top 12]

Needs:
  * a CUDA build of the library (nvcc, no GPU), which compiles the kernel with -lineinfo:
        cmake -S . -B build-cuda -G Ninja -DFLASH_KDA_BUILD_TESTS=OFF
        cmake --build build-cuda --target flash_kda
    OBJECT is its kda_fwd_sm90.cu.o (K = V = 128; kda_fwd64_sm90.cu.o with --dim 64); by default
    the newest one under build*/ (build-cuda/, the build/test/ of scripts/test.sh, a pip build
    folder);
  * cuobjdump and nvdisasm: from the CUDA toolkit (on PATH, or in $CUDA_HOME/bin or
    /usr/local/cuda/bin), or from PyPI: `pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm`
    (they land in site-packages/nvidia/cu*/bin, where this script looks too).

Every SASS instruction of the chosen instantiation (consumer warps per CTA) is attributed, through
nvdisasm's inlining information, to the innermost function of the kernel's own sources that is not
a small helper (a body of at most 4 lines, such as `pair` or `group_sync`; ptx.cuh and the CUDA
headers are helpers too): the phase it belongs to (`producer::tiles`, `consumer::run`, ...). The counts are static (per instruction in the code, not per execution): loop bodies that
run once per chunk dominate what a chunk costs. Opcode classes: shared (LDS/STS/LDSM), global
(LDG/STG/LDGSTS), mufu, mma (HMMA), fp, int, control (BAR/BRA/...), other.
"""

import argparse
import collections
import glob
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OBJECT_DIR_IN_BUILD = os.path.join("CMakeFiles", "flash_kda.dir", "src", "cuda", "sm90")
OBJECT_OF_DIM = {128: "kda_fwd_sm90.cu.o", 64: "kda_fwd64_sm90.cu.o"}  # the fused kernel per head dimension
BUILD_COMMANDS = ("cmake -S . -B build-cuda -G Ninja -DFLASH_KDA_BUILD_TESTS=OFF && "
                  "cmake --build build-cuda --target flash_kda")
KERNEL_FILES = ("kda_fwd_producer.cuh", "kda_fwd_consumer.cuh", "kda_fwd_scheduler.cuh", "kda_fwd_kernel.cuh")
CLASSES = [("shared", ("LDS", "STS", "LDSM", "ATOMS")), ("global", ("LDG", "STG", "LDGSTS", "LDGDEPBAR")),
           ("mufu", ("MUFU",)), ("mma", ("HMMA",)),
           ("fp", ("FFMA", "FMUL", "FADD", "FSEL", "FSETP", "FMNMX", "FCHK", "F2F", "F2I", "I2F")),
           ("int", ("IMAD", "IADD3", "IADD", "LEA", "SHF", "LOP3", "ISETP", "IABS", "PRMT", "SEL", "VIADD",
                    "IMNMX", "MOV", "UMOV", "ULDC", "LDC", "S2R", "CS2R", "S2UR", "UIADD3", "ULEA", "USHF",
                    "UIMAD", "ULOP3")),
           ("control", ("BAR", "BRA", "BSSY", "BSYNC", "EXIT", "WARPSYNC", "SHFL", "VOTE", "DEPBAR", "NOP",
                        "CALL", "RET", "YIELD"))]


def default_object(dim):
    """The newest kda_fwd_sm90.cu.o (dim 64: kda_fwd64_sm90.cu.o) of a CUDA build under the
    repository's build*/ folders."""
    in_build = os.path.join(OBJECT_DIR_IN_BUILD, OBJECT_OF_DIM[dim])
    found = glob.glob(os.path.join(ROOT, "build*", in_build))
    found += glob.glob(os.path.join(ROOT, "build*", "*", in_build))
    if not found:
        sys.exit("sass_mix.py: no CUDA build of the forward kernel under build*/. Build one (nvcc, no GPU "
                 f"needed), from the repository root:\n  {BUILD_COMMANDS}\nor pass the object file.")
    return max(found, key=os.path.getmtime)


def tool(name):
    found = shutil.which(name)
    if found:
        return found
    dirs = [os.path.join(os.environ["CUDA_HOME"], "bin")] if os.environ.get("CUDA_HOME") else []
    dirs.append("/usr/local/cuda/bin")
    for base in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}:
        dirs += sorted(glob.glob(os.path.join(base, "nvidia", "cu*", "bin")), reverse=True)
    dirs = list(dict.fromkeys(dirs))
    for d in dirs:
        if os.access(os.path.join(d, name), os.X_OK):
            return os.path.join(d, name)
    sys.exit(f"sass_mix.py: {name} not found (looked on PATH, in {', '.join(dirs)}). Some CUDA toolkits ship "
             "without it; PyPI has both tools: `pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm`")


def opclass(op):
    for name, prefixes in CLASSES:
        if op in prefixes:
            return name
    return "other"


def functions_of(path):
    """Line number -> (name of the function defined around that line, whether it is a small helper:
    a body of at most 4 lines), by a simple scan of the file."""
    try:
        text = open(path).read().split("\n")
    except OSError:
        return {}
    starts = []
    for i, line in enumerate(text, 1):
        m = re.match(r"\s*(?:template\s*<[^>]*>\s*)?__device__\s+(?:[\w:<>,&*\s]+?\s)?(\w+)\s*\(", line)
        if m:
            starts.append((i, m.group(1)))
    names = {}
    for k, (start, name) in enumerate(starts):
        end = starts[k + 1][0] - 1 if k + 1 < len(starts) else len(text)
        body = [t for t in text[start - 1:end] if t.strip() and not t.strip().startswith("//")]
        small = sum(1 for t in body if t.strip() not in ("}", "};")) <= 4
        for i in range(start, end + 1):
            names[i] = (name, small)
    return names


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("object", nargs="?", default=None,
                    help="kda_fwd_sm90.cu.o of a CUDA build (default: the newest under build*/)")
    ap.add_argument("--dim", type=int, default=128, choices=(128, 64), help="the head dimension K = V (default 128)")
    ap.add_argument("--kernel", type=int, default=1, choices=(1, 2, 4, 8),
                    help="the instantiation: consumer warps per CTA (default 1: the small-H shape; at most 4 "
                         "with --dim 64)")
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    cuobjdump, nvdisasm = tool("cuobjdump"), tool("nvdisasm")
    if args.object is None:
        args.object = default_object(args.dim)
        print(f"object: {os.path.relpath(args.object, ROOT)}")
    elif not os.path.exists(args.object):
        sys.exit(f"sass_mix.py: {args.object}: not found. A CUDA build makes it:\n  {BUILD_COMMANDS}")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([cuobjdump, "-xelf", "all", os.path.abspath(args.object)], cwd=tmp, check=True,
                       stdout=subprocess.DEVNULL)
        cubins = sorted(glob.glob(os.path.join(tmp, "*.cubin")))
        if not cubins:
            sys.exit("no cubin in the object")
        sass = subprocess.run([nvdisasm, "--print-line-info-inline", "-c", cubins[0]], check=True,
                              capture_output=True, text=True).stdout.split("\n")
    body, active = [], False
    for line in sass:
        m = re.match(r"\s*\.text\.(\S+):", line)
        if m:
            active = f"KdaFwdTraitsILi{args.dim}ELi{args.kernel}EE" in m.group(1) and "kda_fwd_kernel" in m.group(1)
            continue
        if active:
            body.append(line)
    if not body:
        sys.exit(f"no kda_fwd_kernel instantiation with D = {args.dim} and {args.kernel} consumer warps in the object")

    # Before each run of instructions nvdisasm prints their inlining chain, one line per level,
    # innermost first, the kernel's own line last.
    fn_maps, where, chain = {}, None, []
    per_fn = collections.defaultdict(collections.Counter)
    for line in body:
        m = re.search(r'//## File "([^"]+)", line (\d+)', line)
        if m:
            chain.append((m.group(1), int(m.group(2))))
            continue
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line)
        if not m:
            continue
        if chain:
            where = "kernel"
            for path, ln in chain:  # the first kernel function that is not a helper
                if os.path.basename(path) not in KERNEL_FILES:
                    continue
                if path not in fn_maps:
                    fn_maps[path] = functions_of(path)
                name, small = fn_maps[path].get(ln, ("?", False))
                if not small and name != "?":
                    role = os.path.basename(path).replace("kda_fwd_", "").replace(".cuh", "")
                    where = f"{role}::{name}"
                    break
            chain = []
        if where:
            per_fn[where][opclass(m.group(1))] += 1
    total = sum(sum(c.values()) for c in per_fn.values())
    cols = [c for c, _ in CLASSES] + ["other"]
    print(f"kda_fwd_kernel<D = {args.dim}, {args.kernel} consumer warps>: {total} SASS instructions")
    print(f"{'function':<30}{'all':>6}" + "".join(f"{c:>8}" for c in cols))
    for fn, c in sorted(per_fn.items(), key=lambda x: -sum(x[1].values()))[:args.top]:
        print(f"{fn:<30}{sum(c.values()):>6}" + "".join(f"{c[k]:>8}" for k in cols))
    return 0


if __name__ == "__main__":
    sys.exit(main())
