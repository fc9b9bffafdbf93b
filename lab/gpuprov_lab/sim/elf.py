"""Part of the gpuprov lab simulation: minimal ELF shared objects for the simulated libraries.

ldconfig, ``nvidia-ctk cdi generate`` and roles that look for ``libnvidia-ml.so.1`` treat a library as
real when it is an x86-64 ELF shared object with a SONAME. :func:`shared_object` writes exactly that
(one PT_LOAD, one PT_DYNAMIC with DT_STRTAB/DT_STRSZ/DT_SONAME), plus a label string saying it is
simulated. It holds no code.
"""

from __future__ import annotations

import struct

ET_DYN = 3
EM_X86_64 = 62
PT_LOAD = 1
PT_DYNAMIC = 2
DT_NULL, DT_STRTAB, DT_STRSZ, DT_SONAME = 0, 5, 10, 14
EHDR = 64
PHDR = 56


def shared_object(soname: str, label: str) -> bytes:
    """A code-free ELF64 shared object whose SONAME is soname."""
    dynstr = b"\0" + soname.encode() + b"\0" + label.encode() + b"\0"
    str_off = EHDR + 2 * PHDR
    dyn_off = (str_off + len(dynstr) + 7) & ~7
    dynamic = b"".join(
        struct.pack("<qQ", tag, value)
        for tag, value in ((DT_STRTAB, str_off), (DT_STRSZ, len(dynstr)), (DT_SONAME, 1), (DT_NULL, 0))
    )
    size = dyn_off + len(dynamic)
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + b"\0" * 8  # 64-bit, little endian, SysV
    ehdr = ident + struct.pack("<HHIQQQIHHHHHH", ET_DYN, EM_X86_64, 1, 0, EHDR, 0, 0, EHDR, PHDR, 2, 64, 0, 0)
    load = struct.pack("<IIQQQQQQ", PT_LOAD, 4, 0, 0, 0, size, size, 0x1000)
    dyn = struct.pack("<IIQQQQQQ", PT_DYNAMIC, 4, dyn_off, dyn_off, dyn_off, len(dynamic), len(dynamic), 8)
    body = ehdr + load + dyn + dynstr
    return body + b"\0" * (dyn_off - len(body)) + dynamic
