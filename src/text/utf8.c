/* utf8.c - the UTF-8 validator (utf8.h). */
#include "utf8.h"

size_t utf8_len(const unsigned char *s, size_t n, size_t *bad) {
    unsigned char c = s[0];
    size_t need, dummy;
    unsigned char lo = 0x80, hi = 0xBF; /* the second byte's range: narrower after E0, ED, F0, F4 */
    if (!bad) bad = &dummy;
    *bad = 1;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        if (c == 0xE0) lo = 0xA0; /* overlong */
        if (c == 0xED) hi = 0x9F; /* surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        if (c == 0xF0) lo = 0x90; /* overlong */
        if (c == 0xF4) hi = 0x8F; /* above U+10FFFF */
    } else {
        return 0;
    }
    for (size_t i = 1; i <= need; i++) {
        if (i >= n || s[i] < lo || s[i] > hi) {
            *bad = i;
            return 0;
        }
        lo = 0x80, hi = 0xBF;
    }
    return need + 1;
}
