"""gguf_read.py - a small GGUF reader for tests: metadata, tensor table, tensor bytes.

Usage as a module (tests/t_reap.sh): g = Gguf(path); g.kv[key]; g.tensors[name] = (type, ne, offset);
g.data(name) -> bytes. Only the tensor types the tests write have sizes here."""
import struct

# ggml type: (block size, bytes per block)
TYPES = {0: (1, 4), 1: (1, 2), 8: (32, 34), 12: (256, 144), 30: (1, 2)}


class Gguf:
    def __init__(self, path):
        self.f = open(path, 'rb')
        b = self.f.read()
        self.buf = b
        assert b[:4] == b'GGUF', path
        self.p = 4
        _version, n_t, n_kv = self.u('<IQQ')
        self.kv = {}
        for _ in range(n_kv):
            k = self.s()
            t, = self.u('<I')
            self.kv[k] = self.val(t)
        self.tensors = {}
        infos = []
        for _ in range(n_t):
            name = self.s()
            nd, = self.u('<I')
            ne = list(self.u('<' + 'Q' * nd))
            t, off = self.u('<IQ')
            infos.append((name, t, ne, off))
        al = self.kv.get('general.alignment', 32)
        start = (self.p + al - 1) // al * al
        for name, t, ne, off in infos:
            self.tensors[name] = (t, ne, start + off)

    def u(self, fmt):
        v = struct.unpack_from(fmt, self.buf, self.p)
        self.p += struct.calcsize(fmt)
        return v

    def s(self):
        n, = self.u('<Q')
        v = self.buf[self.p:self.p + n].decode('utf-8', 'replace')
        self.p += n
        return v

    def val(self, t):
        scal = {0: '<B', 1: '<b', 2: '<H', 3: '<h', 4: '<I', 5: '<i', 6: '<f', 7: '<?', 10: '<Q', 11: '<q', 12: '<d'}
        if t in scal:
            return self.u(scal[t])[0]
        if t == 8:
            return self.s()
        if t == 9:
            et, n = self.u('<IQ')
            return [self.val(et) for _ in range(n)]
        raise ValueError('gguf type %d' % t)

    def nbytes(self, name):
        t, ne, _ = self.tensors[name]
        bs, bb = TYPES[t]
        n = 1
        for x in ne[1:]:
            n *= x
        return ne[0] // bs * bb * n

    def data(self, name):
        _, _, off = self.tensors[name]
        return self.buf[off:off + self.nbytes(name)]
