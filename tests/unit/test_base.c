/* test_base - the shared pieces of src/base/ that have no test of their own elsewhere:
 * - the growable buffer (buf.h): pieces appended in order and kept NUL-terminated, a printf longer than its
 *   on-stack first try, take handing the bytes over and leaving the buffer empty, and the sticky
 *   out-of-memory flag (a writer of many pieces checks once);
 * - the JSON getters (json.h): lookups' defaults, the strict readers' ranges, types and required fields;
 * - rl_mkdirs (file.h): parents made, an existing folder fine, a file in the way and an overlong path refused.
 * The ASan build runs it too. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cJSON.h>

#include "base/buf.h"
#include "base/file.h"
#include "base/json.h"

#include "check.h"

static void test_json(void) {
    cJSON *o = cJSON_Parse("{\"s\": \"x\", \"n\": 2.5, \"u\": 7, \"neg\": -1, \"big\": 4294967296, "
                           "\"frac\": 1.5, \"t\": true, \"str\": \"7\"}");
    CHECK(o != NULL, "the JSON parses");
    if (!o) return;
    CHECK(strcmp(rl_json_str(o, "s"), "x") == 0 && !rl_json_str(o, "n") && !rl_json_str(o, "none") && !rl_json_str(NULL, "s"),
          "rl_json_str: the string, NULL for another type, an absent key or no object");
    CHECK(rl_json_num(o, "n", -1) == 2.5 && rl_json_num(o, "s", -1) == -1 && rl_json_num(NULL, "n", 3) == 3,
          "rl_json_num: the number, else the default");
    uint32_t u = 99;
    rl_err e = {{0}};
    int ok = rl_json_u32(o, "u", true, &u, &e) == 0 && u == 7;
    u = 99;
    ok = ok && rl_json_u32(o, "absent", false, &u, &e) == 0 && u == 99;
    ok = ok && rl_json_u32(o, "absent", true, &u, &e) == -1 && strstr(e.msg, "field \"absent\" is missing");
    const char *bad[] = {"neg", "big", "frac", "str", "t"};
    for (int i = 0; i < 5; i++)
        ok = ok && rl_json_u32(o, bad[i], false, &u, &e) == -1 && strstr(e.msg, bad[i]) && strstr(e.msg, "non-negative integer") && u == 99;
    CHECK(ok, "rl_json_u32: 7 read; absent leaves the default or, required, is named; -1, 2^32, 1.5, \"7\", true refused by name");
    bool t = false, d = true;
    CHECK(rl_json_bool(o, "t", false, &t, &e) == 0 && t && rl_json_bool(o, "u", false, &d, &e) == -1 &&
              strstr(e.msg, "\"u\" must be true or false") && d && rl_json_bool(o, "absent", true, &d, &e) == -1,
          "rl_json_bool: true read; a number refused by name; a required absent one named");
    cJSON_Delete(o);
}

static void test_mkdirs(void) {
    char root[] = "/tmp/test_base_XXXXXX", path[PATH_MAX + 64];
    if (!mkdtemp(root)) {
        CHECK(0, "a temporary folder: %s", strerror(errno));
        return;
    }
    snprintf(path, sizeof path, "%s/a/b/c", root);
    struct stat st;
    CHECK(rl_mkdirs(path) == 0 && stat(path, &st) == 0 && S_ISDIR(st.st_mode) && rl_mkdirs(path) == 0,
          "rl_mkdirs makes a/b/c with its parents, and again is fine");
    char file[PATH_MAX];
    snprintf(file, sizeof file, "%s/f", root);
    FILE *f = fopen(file, "w");
    if (f) fclose(f);
    snprintf(path, sizeof path, "%s/f/x", root);
    int r1 = rl_mkdirs(file), e1 = errno, r2 = rl_mkdirs(path), e2 = errno;
    CHECK(r1 == -1 && e1 == ENOTDIR && r2 == -1, "a file in the way is refused (%s; under it: %s)", strerror(e1), strerror(e2));
    memset(path, 'x', sizeof path - 1);
    path[0] = '/', path[sizeof path - 1] = 0;
    CHECK(rl_mkdirs(path) == -1 && errno == ENAMETOOLONG, "a path past PATH_MAX is refused, not cut short");
    unlink(file);
    snprintf(path, sizeof path, "%s/a/b/c", root), rmdir(path);
    snprintf(path, sizeof path, "%s/a/b", root), rmdir(path);
    snprintf(path, sizeof path, "%s/a", root), rmdir(path);
    rmdir(root);
}

int main(void) {
    test_json();
    test_mkdirs();
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
