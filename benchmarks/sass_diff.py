"""Compare the machine code of two builds kernel by kernel (a refactor must leave it unchanged).

    cuobjdump -sass old/_flashsci*.so > old.sass; cuobjdump -sass new/_flashsci*.so > new.sass
    python benchmarks/sass_diff.py old.sass new.sass

Each kernel is keyed by (architecture, mangled name) and compared by its instruction text with addresses and
encodings removed; kernels that moved between translation units still match. Prints one line per kernel that
differs or exists in only one build, saying whether only register numbers differ or how many instructions do and
where (before or after the kernel's first setmaxnreg.dec, i.e. in a warp-specialised kernel's producer), then a
summary; exits 1 if anything differs.
"""
import re
import sys
from collections import defaultdict

_ADDR = re.compile(r"/\*[0-9a-f]{4,}\*/")
_ENC = re.compile(r"/\* 0x[0-9a-f]+ \*/")
_REG = re.compile(r"\bR\d+\b")
_TARGET = re.compile(r"0x[0-9a-f]+ ;$")


def kernels(path):
    """{(arch, function): [instruction lines]} of a cuobjdump -sass listing."""
    out, arch, fn = defaultdict(list), None, None
    with open(path) as f:
        for line in f:
            s = line.strip()
            if s.startswith("arch = "):
                arch, fn = s.split("=", 1)[1].strip(), None
            elif s.startswith("Function : "):
                fn = (arch, s.split(":", 1)[1].strip())
            elif fn and s.startswith("/*") and not s.startswith("/* 0x"):
                text = _ENC.sub("", _ADDR.sub("", s)).strip()
                if text:
                    out[fn].append(text)
    return out


def describe(old, new):
    """How two instruction lists of one kernel differ: registers only, or which instructions beyond that."""
    if len(old) != len(new):
        return f"{len(old)} -> {len(new)} instructions"
    norm = lambda x: _REG.sub("R", _TARGET.sub("ADDR ;", x.replace(".reuse", "")))
    ops = [i for i, (a, b) in enumerate(zip(old, new)) if norm(a) != norm(b)]
    regs = [i for i, (a, b) in enumerate(zip(old, new)) if a != b]
    dealloc = next((i for i, x in enumerate(old) if x.startswith("USETMAXREG.DEALLOC")), None)
    where = lambda idx: "" if dealloc is None else (" (all after setmaxnreg.dec)" if min(idx) > dealloc else
                                                     " (some before setmaxnreg.dec)")
    if not ops:
        return f"{len(old)} instructions, register numbers differ in {len(regs)}{where(regs)}"
    return f"{len(old)} instructions, {len(ops)} differ beyond register numbers at {min(ops)}-{max(ops)}{where(ops)}"


def main(argv):
    if len(argv) != 2:
        sys.exit(__doc__)
    old, new = (kernels(p) for p in argv)
    differ = [k for k in sorted(old.keys() & new.keys()) if old[k] != new[k]]
    only_old, only_new = sorted(old.keys() - new.keys()), sorted(new.keys() - old.keys())
    for arch, fn in differ:
        print(f"differs   {arch} {fn}: {describe(old[(arch, fn)], new[(arch, fn)])}")
    for arch, fn in only_old:
        print(f"only old  {arch} {fn}")
    for arch, fn in only_new:
        print(f"only new  {arch} {fn}")
    same = len(old.keys() & new.keys()) - len(differ)
    print(f"{same} kernels identical, {len(differ)} differ, {len(only_old)} only in the first, {len(only_new)} only in "
          f"the second")
    return 1 if differ or only_old or only_new else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
