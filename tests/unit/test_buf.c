/* test_buf - the growable buffer (src/base/buf.h): pieces appended in order and kept NUL-terminated, a
 * printf longer than its on-stack first try, take handing the bytes over and leaving the buffer empty, and
 * the sticky out-of-memory flag (a writer of many pieces checks once). The ASan build runs it too. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"

#include "check.h"

int main(void) {
    rl_buf b = {0};
    size_t n = 99;
    CHECK(rl_buf_take(&b, &n) == NULL && n == 0, "an untouched buffer takes as NULL, 0 bytes");
    int rc = rl_buf_add(&b, "ab", 2) | rl_buf_add(&b, "", 0) | rl_buf_printf(&b, "-%d-", 42);
    CHECK(rc == 0 && b.len == 6 && strcmp(b.p, "ab-42-") == 0, "pieces in order, NUL-terminated: '%s'", b.p ? b.p : "");
    char big[3000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    rc = rl_buf_printf(&b, "%s!", big); /* past the 1024-byte first try: formatted again into its size */
    CHECK(rc == 0 && b.len == 6 + 3000 && b.p[b.len - 1] == '!' && b.p[b.len] == 0 && b.cap >= b.len + 1,
          "a printf of 3000 bytes whole (%zu bytes, capacity %zu)", b.len, b.cap);
    size_t len = 0;
    char *p = rl_buf_take(&b, &len);
    CHECK(p && len == 3006 && strncmp(p, "ab-42-xxx", 9) == 0 && b.p == NULL && b.len == 0 && b.cap == 0,
          "take hands over the bytes and leaves the buffer empty");
    free(p);
    CHECK(rl_buf_add(&b, "again", 5) == 0 && strcmp(b.p, "again") == 0, "a taken buffer is used again");
    b.oom = true; /* as after a failed realloc */
    CHECK(rl_buf_add(&b, "x", 1) == -1 && rl_buf_printf(&b, "y") == -1 && b.len == 5,
          "after an allocation failed, later adds fail too and change nothing");
    rl_buf_free(&b);
    CHECK(b.p == NULL && b.len == 0 && !b.oom, "free leaves an empty buffer");
    return check_done();
}
