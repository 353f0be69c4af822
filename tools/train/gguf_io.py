"""gguf_io.py - the little of GGUF the trainers need: read a file's metadata and f32 tensors, and write a
copy whose tensors hold new values.

The files come from `ringlm synth --type f32` (every tensor f32), so a trained model is synth's own file
(its tokenizer, chat template and key layout) with the trained values written over the seeded ones at the
same offsets. Format: ggml's docs/gguf.md (little-endian; header, key/values, tensor infos, aligned data).
"""
import struct

import numpy as np

GGUF_MAGIC = b"GGUF"
# key/value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?", U64: "<Q",
          I64: "<q", F64: "<d"}
GGML_TYPE_F32 = 0


class Reader:
    def __init__(self, data, pos=0):
        self.d, self.p = data, pos

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.d, self.p)[0]
        self.p += struct.calcsize(fmt)
        return v

    def string(self):
        n = self.take("<Q")
        s = bytes(self.d[self.p:self.p + n]).decode("utf-8", errors="replace")
        self.p += n
        return s

    def value(self, t):
        if t == STR:
            return self.string()
        if t == ARR:
            et, n = self.take("<I"), self.take("<Q")
            return [self.value(et) for _ in range(n)]
        return self.take(SCALAR[t])


class Gguf:
    """kv: dict of metadata; tensors: name -> (shape in ggml ne order, type, absolute offset)."""

    def __init__(self, path):
        with open(path, "rb") as f:
            self.raw = bytearray(f.read())
        r = Reader(self.raw)
        if bytes(self.raw[:4]) != GGUF_MAGIC:
            raise ValueError(f"{path} is not a GGUF file")
        r.p = 4
        self.version = r.take("<I")
        n_tensors, n_kv = r.take("<Q"), r.take("<Q")
        self.kv = {}
        self.types = {}  # key -> (GGUF type, element type of an array), to write the keys back as read
        for _ in range(n_kv):
            k = r.string()
            t = r.take("<I")
            self.types[k] = (t, struct.unpack_from("<I", self.raw, r.p)[0] if t == ARR else None)
            self.kv[k] = r.value(t)
        infos = []
        for _ in range(n_tensors):
            name = r.string()
            nd = r.take("<I")
            ne = [r.take("<Q") for _ in range(nd)]
            infos.append((name, ne, r.take("<I"), r.take("<Q")))
        align = self.kv.get("general.alignment", 32)
        base = (r.p + align - 1) // align * align
        self.tensors = {n: (ne, t, base + off) for n, ne, t, off in infos}
        self.order = [i[0] for i in infos]

    def array(self, name):
        """The tensor as a float32 numpy array shaped in row-major order (ne reversed): a ggml matrix {K, N}
        becomes (N, K), the layout of a torch Linear weight."""
        ne, t, off = self.tensors[name]
        if t != GGML_TYPE_F32:
            raise ValueError(f"tensor {name} is type {t}, not f32: write the model with --type f32")
        n = int(np.prod(ne))
        return np.frombuffer(self.raw, dtype="<f4", count=n, offset=off).reshape(list(reversed(ne))).copy()

    def write(self, path, values, strings=None):
        """A new file: this one's keys (with `strings`, key -> new string value, set or added), tensor
        table and data, the tensors in `values` (name -> array of the same element count, f32) replaced."""
        strings = strings or {}
        kv, types = dict(self.kv), dict(self.types)
        for k, v in strings.items():
            kv[k], types[k] = v, (STR, None)
        head = bytearray(GGUF_MAGIC + struct.pack("<IQQ", self.version, len(self.order), len(kv)))

        def put(t, v, et=None):
            if t == STR:
                b = v.encode()
                head.extend(struct.pack("<Q", len(b)) + b)
            elif t == ARR:
                head.extend(struct.pack("<IQ", et, len(v)))
                for x in v:
                    put(et, x)
            else:
                head.extend(struct.pack(SCALAR[t], v))

        for k, v in kv.items():
            t, et = types[k]
            put(STR, k)
            head.extend(struct.pack("<I", t))
            put(t, v, et)
        align = kv.get("general.alignment", 32)
        data = bytearray()
        for name in self.order:
            ne, t, off = self.tensors[name]
            size = self.nbytes(name)
            put(STR, name)
            head.extend(struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", x) for x in ne))
            head.extend(struct.pack("<IQ", t, len(data)))
            if name in values:
                a = np.ascontiguousarray(values[name], dtype="<f4").reshape(-1)
                if t != GGML_TYPE_F32 or a.nbytes != size:
                    raise ValueError(f"tensor {name}: {a.size} values for shape {ne} type {t}")
                data.extend(a.tobytes())
            else:
                data.extend(self.raw[off:off + size])
            data.extend(b"\0" * ((-len(data)) % align))
        head.extend(b"\0" * ((-len(head)) % align))
        with open(path, "wb") as f:
            f.write(head)
            f.write(data)

    def nbytes(self, name):
        ne, t, off = self.tensors[name]
        if t != GGML_TYPE_F32:
            raise ValueError(f"tensor {name} is type {t}, not f32: write the model with --type f32")
        return 4 * int(np.prod(ne))
