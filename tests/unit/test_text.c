/* test_text - tokenizer, detokenizer, chat formatting and samplers (src/text), without the oracle.
 *
 * The tokenizer runs on a vocabulary built in memory the way `ringlm synth` builds it (1024 tokens); its
 * token ids are compared with llama.cpp's by tests/t_tokenizer.sh, so here it is round trips, special
 * tokens, invalid UTF-8, load errors and the streaming detokenizer. The chat expectations below were
 * rendered by llama.cpp's own Jinja engine (common_chat_templates_apply) from Kimi-K3.jinja, ringlm synth's
 * template, Kimi-K2-Instruct.jinja and Kimi-K2-Thinking.jinja on the same conversations. The samplers are
 * checked on logits whose answer is known. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "text/chat.h"
#include "text/chat_out.h"
#include <cJSON.h>

#include "text/chat_gram.h"
#include "text/chat_out.h"
#include "text/grammar.h"
#include "text/json_schema.h"
#include "text/sampler.h"
#include "speculate/accept.h"
#include "text/tokenizer.h"
#include "text/utf8.h"
#include "tools/synth_vocab.h"

#include "check.h"

/* strict UTF-8 check (RFC 3629: no overlongs, no surrogates, nothing above U+10FFFF) */
static int utf8_valid(const char *str, size_t n) {
    const unsigned char *s = (const unsigned char *)str;
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t k;
        unsigned lo = 0x80, hi = 0xBF;
        if (c < 0x80) { i++; continue; }
        else if (c >= 0xC2 && c <= 0xDF) k = 2;
        else if (c >= 0xE0 && c <= 0xEF) { k = 3; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
        else if (c >= 0xF0 && c <= 0xF4) { k = 4; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
        else return 0;
        if (i + k > n) return 0;
        if (s[i + 1] < lo || s[i + 1] > hi) return 0;
        for (size_t j = 2; j < k; j++)
            if ((s[i + j] & 0xC0) != 0x80) return 0;
        i += k;
    }
    return 1;
}

/* encode then decode; 1 if the bytes come back unchanged */
static int round_trip(const tok_tokenizer *t, const char *s, size_t n, bool special) {
    int32_t *ids;
    size_t ni, dl;
    char *d = NULL;
    rl_err err;
    if (tok_encode(t, s, n, special, &ids, &ni, &err)) return 0;
    int ok = tok_decode(t, ids, ni, special, false, &d, &dl, &err) == 0 && dl == n && memcmp(d, s, n) == 0;
    free(ids);
    free(d);
    return ok;
}

static int decodes_to(const tok_tokenizer *t, const char *s, size_t n, const char *want, size_t wn) {
    int32_t *ids;
    size_t ni, dl;
    char *d = NULL;
    rl_err err;
    if (tok_encode(t, s, n, false, &ids, &ni, &err)) return 0;
    int ok = tok_decode(t, ids, ni, false, false, &d, &dl, &err) == 0 && dl == wn && memcmp(d, want, wn) == 0;
    free(ids);
    free(d);
    return ok;
}

/* the corpus file's escapes (\\ \n \r \t \xHH), in place; -1 on a bad escape */
static long unescape(char *s, size_t len) {
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] != '\\') {
            s[o++] = s[i];
            continue;
        }
        if (++i >= len) return -1;
        char c = s[i];
        if (c == '\\') s[o++] = '\\';
        else if (c == 'n') s[o++] = '\n';
        else if (c == 'r') s[o++] = '\r';
        else if (c == 't') s[o++] = '\t';
        else if (c == 'x' && i + 2 < len) {
            char hx[3] = {s[i + 1], s[i + 2], 0};
            s[o++] = (char)strtol(hx, NULL, 16);
            i += 2;
        } else return -1;
    }
    return (long)o;
}

static void test_tokenizer(const tok_tokenizer *t) {
    rl_err err;
    int32_t *ids;
    size_t n;

    /* round trips over the shared corpus (the valid UTF-8 lines) */
    const char *root = getenv("ROOT");
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/data/tokenizer_strings.txt", root ? root : ".");
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL, "corpus %s opens", path);
    if (f) {
        char *line = NULL;
        size_t cap = 0;
        ssize_t got;
        int total = 0, valid = 0, ok_plain = 0, ok_special = 0;
        while ((got = getline(&line, &cap, f)) >= 0) {
            size_t ll = (size_t)got;
            if (ll && line[ll - 1] == '\n') ll--;
            long ul = unescape(line, ll);
            total++;
            if (ul < 0 || !utf8_valid(line, (size_t)ul)) continue;
            valid++;
            ok_plain += round_trip(t, line, (size_t)ul, false);
            ok_special += round_trip(t, line, (size_t)ul, true);
        }
        free(line);
        fclose(f);
        CHECK(total >= 220 && valid >= 180, "corpus has %d strings, %d valid UTF-8", total, valid);
        CHECK(ok_plain == valid, "decode(encode(s)) == s for %d/%d valid strings (parse_special off)", ok_plain, valid);
        CHECK(ok_special == valid, "decode(encode(s)) == s for %d/%d valid strings (parse_special on, specials rendered)",
              ok_special, valid);
    }

    /* invalid UTF-8 as llama.cpp reads it */
    CHECK(decodes_to(t, "\xff", 1, "\xef\xbf\xbd", 3), "an invalid byte becomes U+FFFD");
    CHECK(decodes_to(t, "\xe4\xb8", 2, "\xef\xbf\xbd\xef\xbf\xbd", 6), "a truncated sequence: one U+FFFD per byte");
    CHECK(decodes_to(t, "\xc0\xaf", 2, "/", 1), "an overlong '/' is read as '/'");
    CHECK(decodes_to(t, "a\xed\xa0\x80z", 5, "a\xed\xa0\x80z", 5), "a surrogate passes through unchanged");
    CHECK(decodes_to(t, "\xf7\xbf\xbf\xbf", 4, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", 12),
          "a sequence above U+10FFFF (llama.cpp aborts) becomes 4 x U+FFFD");
    CHECK(tok_encode(t, "", 0, true, &ids, &n, &err) == 0 && n == 0, "the empty string has no tokens");
    free(ids);
    CHECK(tok_encode(t, "a\0b", 3, false, &ids, &n, &err) == 0 && n == 3 && ids[1] == 0, "NUL bytes are text (byte token 0)");
    free(ids);

    /* special tokens */
    int32_t open = tok_find(t, "<|open|>", 8), eom = tok_find(t, "<|end_of_msg|>", 14);
    CHECK(open == t->n_vocab - 256 + 3 && (tok_attr(t, open) & TOK_ATTR_CONTROL), "<|open|> is CONTROL id %d", open);
    CHECK(tok_encode(t, "<|open|>", 8, true, &ids, &n, &err) == 0 && n == 1 && ids[0] == open,
          "parse_special: <|open|> is one token");
    free(ids);
    CHECK(tok_encode(t, "<|open|>", 8, false, &ids, &n, &err) == 0 && n > 1, "no parse_special: <|open|> is text (%zu tokens)", n);
    free(ids);
    CHECK(tok_encode(t, "x<|open|><|sep|>y", 17, true, &ids, &n, &err) == 0 && n == 4 && ids[1] == open &&
              ids[2] == tok_find(t, "<|sep|>", 7),
          "specials between text: x, <|open|>, <|sep|>, y");
    free(ids);
    const char *p;
    size_t pl;
    CHECK(tok_piece(t, open, false, &p, &pl) == 0 && pl == 0, "a control token renders as nothing without special");
    CHECK(tok_piece(t, open, true, &p, &pl) == 0 && pl == 8 && memcmp(p, "<|open|>", 8) == 0, "... and as its text with special");
    CHECK(tok_piece(t, t->n_vocab, true, &p, &pl) == -1, "a piece for an id out of range is refused");
    CHECK(t->eos_id == eom && tok_is_eog(t, eom), "EOS is <|end_of_msg|> and ends generation");
    CHECK(tok_is_eog(t, tok_find(t, "[EOT]", 5)) && tok_is_eog(t, tok_find(t, "[EOS]", 5)), "[EOT] and [EOS] end generation");
    CHECK(!t->add_bos && t->bos_id == t->n_vocab - 256, "no automatic BOS; BOS is [BOS]");
    int32_t bad = t->n_vocab + 5;
    char *d;
    CHECK(tok_decode(t, &bad, 1, false, false, &d, &pl, &err) != 0 && strstr(err.msg, "outside the vocabulary"),
          "decoding an unknown id fails: %s", err.msg);
}

/* a gguf with just the tokenizer keys the test sets */
static int load_with(const char *model, const char *pre, bool bad_types, bool dup, rl_err *err) {
    struct gguf_context *g = gguf_init_empty();
    if (model) gguf_set_val_str(g, "tokenizer.ggml.model", model);
    if (pre) gguf_set_val_str(g, "tokenizer.ggml.pre", pre);
    const char *toks[3] = {"a", "b", dup ? "a" : "ab"};
    gguf_set_arr_str(g, "tokenizer.ggml.tokens", toks, 3);
    if (bad_types) {
        float ty[3] = {1, 1, 1};
        gguf_set_arr_data(g, "tokenizer.ggml.token_type", GGUF_TYPE_FLOAT32, ty, 3);
    }
    tok_tokenizer t;
    int rc = tok_load_gguf(&t, g, err);
    if (rc == 0) tok_free(&t);
    gguf_free(g);
    return rc;
}

static void test_load_errors(void) {
    rl_err err;
    CHECK(load_with(NULL, "kimi-k2", false, false, &err) != 0 && strstr(err.msg, "no tokenizer.ggml.model"), "no model: %s", err.msg);
    CHECK(load_with("llama", "kimi-k2", false, false, &err) != 0 && strstr(err.msg, "'llama' is not supported"),
          "SentencePiece model refused: %s", err.msg);
    CHECK(load_with("gpt2", "llama3", false, false, &err) != 0 && strstr(err.msg, "pre-tokenizer 'llama3' is not supported"),
          "other pre-tokenizer refused: %s", err.msg);
    CHECK(load_with("gpt2", NULL, false, false, &err) != 0 && strstr(err.msg, "no tokenizer.ggml.pre"), "missing pre-tokenizer: %s", err.msg);
    CHECK(load_with("gpt2", "kimi-k2", true, false, &err) != 0 && strstr(err.msg, "token_type"), "token types of the wrong type: %s", err.msg);
    CHECK(load_with("gpt2", "kimi-k2", false, true, &err) != 0 && strstr(err.msg, "same text"),
          "a repeated token text (llama.cpp aborts on it): %s", err.msg);
    CHECK(load_with("gpt2", "kimi-k2", false, false, &err) == 0, "a 3-token kimi-k2 vocabulary without merges loads");
}

static void test_stream(const tok_tokenizer *t) {
    static const char *const strs[] = {"", "a", "\xe4", "\xe4\xb8", "\xe4\xb8\xad", "a\xf0\x9f\x98", "\xff",
                                       "\xe0\x80", "\xed\xa0", "\x80\x80\x80", "\xc3", "\xf4\x90"};
    static const size_t lens[] = {0, 1, 1, 2, 3, 4, 1, 2, 2, 3, 1, 2};
    static const size_t want[] = {0, 1, 0, 0, 3, 1, 1, 2, 2, 3, 0, 2};
    int ok = 1;
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        size_t got = tok_utf8_safe_prefix(strs[i], lens[i]);
        if (got != want[i]) {
            printf("# safe prefix of case %zu: %zu, want %zu\n", i, got, want[i]);
            ok = 0;
        }
    }
    CHECK(ok, "safe prefix holds back exactly the unfinished, still valid sequences");

    static const char text[] = "h\xc3\xa9llo \xe4\xb8\x96\xe7\x95\x8c \xf0\x9f\x98\x80!";
    size_t tn = sizeof text - 1;
    tok_stream s;
    rl_err err;
    const char *out;
    size_t on;
    char acc[256];
    size_t an = 0;
    int chunks_valid = 1, held_mid = 0;
    tok_stream_init(&s, t, false);
    for (size_t i = 0; i < tn; i++) {
        tok_stream_push_bytes(&s, text + i, 1, &out, &on, &err);
        chunks_valid &= utf8_valid(out, on);
        if (i == 7 && on == 0) held_mid = 1; /* first byte of 世 */
        memcpy(acc + an, out, on);
        an += on;
    }
    tok_stream_flush(&s, &out, &on);
    CHECK(held_mid && chunks_valid && on == 0 && an == tn && memcmp(acc, text, tn) == 0,
          "byte-by-byte stream: split characters are held back, every chunk is whole UTF-8, nothing is lost");

    int32_t *ids;
    size_t n;
    tok_encode(t, text, tn, false, &ids, &n, &err);
    an = 0;
    chunks_valid = 1;
    int held = 0;
    for (size_t i = 0; i < n; i++) {
        const char *pc;
        size_t pn;
        tok_piece(t, ids[i], false, &pc, &pn);
        tok_stream_push(&s, ids[i], &out, &on, &err);
        chunks_valid &= utf8_valid(out, on);
        held |= !utf8_valid(pc, pn);
        memcpy(acc + an, out, on);
        an += on;
    }
    free(ids);
    tok_stream_flush(&s, &out, &on);
    CHECK(held && chunks_valid && on == 0 && an == tn && memcmp(acc, text, tn) == 0,
          "token stream (%zu tokens, some ending mid-character): every chunk is whole UTF-8, the text is complete", n);

    tok_stream_push_bytes(&s, "\xff", 1, &out, &on, &err);
    CHECK(on == 1 && (unsigned char)out[0] == 0xFF, "a byte that can never be valid is passed on at once");
    tok_stream_push_bytes(&s, "ab\xe4\xb8", 4, &out, &on, &err);
    CHECK(on == 2, "'ab' goes out, the start of a character waits");
    tok_stream_flush(&s, &out, &on);
    CHECK(on == 2 && memcmp(out, "\xe4\xb8", 2) == 0, "flush hands out the unfinished bytes");
    tok_stream_free(&s);
}

/* ---- chat ---------------------------------------------------------------------------------------- */

static const char EXP_T1[] =
    "<|open|>message role=\"system\" type=\"thinking-effort\"<|sep|>`thinking_effort` guides on how much to think in your thinking channel (not including the response channel), supported values include `low`, `medium`, `high`, and `max`.\n"
    "Now the system is invoked with `thinking_effort=max`.<|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"system\"<|sep|>You are helpful.<|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"user\"<|sep|>Hi there<|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>The user greets.<|close|>think<|sep|><|open|>response<|sep|>Hello! How can I help?<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"user\"<|sep|>What is the weather in Paris?<|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|><|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"get_weather\" index=\"1\"<|sep|><|open|>argument key=\"city\" type=\"string\"<|sep|>Paris<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"tool\" tool=\"get_weather\" index=\"1\"<|sep|>{\"temp\": 21}<|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|><|close|>think<|sep|><|open|>response<|sep|>It is 21 degrees.<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"user\"<|sep|>Thanks<|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>";
static const char EXP_T2[] =
    "<|open|>message role=\"system\"<|sep|>You are helpful.<|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"user\"<|sep|>Hi there<|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|>Hello! How can I help?<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"user\"<|sep|>What is the weather in Paris?<|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"get_weather\" index=\"1\"<|sep|><|open|>argument key=\"city\" type=\"string\"<|sep|>Paris<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"tool\" tool=\"get_weather\" index=\"1\"<|sep|>{\"temp\": 21}<|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|>It is 21 degrees.<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"user\"<|sep|>Thanks<|close|>message<|sep|><|end_of_msg|>";
static const char EXP_T3[] =
    "<|open|>message role=\"system\"<|sep|>You are helpful.<|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"user\"<|sep|>Hi there<|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>The user greets.<|close|>think<|sep|><|open|>response<|sep|>Hello! How can I help?<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"user\"<|sep|>What is the weather in Paris?<|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|><|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"get_weather\" index=\"1\"<|sep|><|open|>json type=\"object\"<|sep|>{\"city\": \"Paris\"}<|close|>json<|sep|><|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"tool\" tool=\"get_weather\" index=\"1\"<|sep|>{\"temp\": 21}<|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|><|close|>think<|sep|><|open|>response<|sep|>It is 21 degrees.<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"user\"<|sep|>Thanks<|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>";
static const char EXP_T4[] =
    "<|open|>message role=\"system\"<|sep|>You are helpful.<|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"user\"<|sep|>Hi there<|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|>Hello! How can I help?<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"user\"<|sep|>What is the weather in Paris?<|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"get_weather\" index=\"1\"<|sep|><|open|>json type=\"object\"<|sep|>{\"city\": \"Paris\"}<|close|>json<|sep|><|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"tool\" tool=\"get_weather\" index=\"1\"<|sep|>{\"temp\": 21}<|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|>It is 21 degrees.<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"user\"<|sep|>Thanks<|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|>";
static const char EXP_T5[] =
    "<|im_system|>system<|im_middle|>You are helpful.<|im_end|>"
    "<|im_user|>user<|im_middle|>Hi there<|im_end|>"
    "<|im_assistant|>assistant<|im_middle|>Hello! How can I help?<|im_end|>"
    "<|im_user|>user<|im_middle|>What is the weather in Paris?<|im_end|>"
    "<|im_assistant|>assistant<|im_middle|><|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|><|tool_calls_section_end|><|im_end|>"
    "<|im_system|>get_weather<|im_middle|>## Return of functions.get_weather:0\n"
    "{\"temp\": 21}<|im_end|>"
    "<|im_assistant|>assistant<|im_middle|>It is 21 degrees.<|im_end|>"
    "<|im_user|>user<|im_middle|>Thanks<|im_end|>"
    "<|im_assistant|>assistant<|im_middle|>";
static const char EXP_T6[] =
    "<|im_system|>system<|im_middle|>You are helpful.<|im_end|>"
    "<|im_user|>user<|im_middle|>Hi there<|im_end|>"
    "<|im_assistant|>assistant<|im_middle|><think></think>Hello! How can I help?<|im_end|>"
    "<|im_user|>user<|im_middle|>What is the weather in Paris?<|im_end|>"
    "<|im_assistant|>assistant<|im_middle|><think></think><|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|><|tool_calls_section_end|><|im_end|>"
    "<|im_system|>get_weather<|im_middle|>## Return of functions.get_weather:0\n"
    "{\"temp\": 21}<|im_end|>"
    "<|im_assistant|>assistant<|im_middle|><think></think>It is 21 degrees.<|im_end|>"
    "<|im_user|>user<|im_middle|>Thanks<|im_end|>"
    "<|im_assistant|>assistant<|im_middle|>";
static const char EXP_T7[] =
    "<|open|>message role=\"system\" type=\"thinking-effort\"<|sep|>`thinking_effort` guides on how much to think in your thinking channel (not including the response channel), supported values include `low`, `medium`, `high`, and `max`.\n"
    "Now the system is invoked with `thinking_effort=low`.<|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"user\" name=\"bob\"<|sep|>Hi & \"you\"<|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|><|close|>think<|sep|><|open|>response<|sep|>Sure<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"f&quot;x\" index=\"1\"<|sep|><|open|>argument key=\"s\" type=\"string\"<|sep|>x\"y\xc3""\xa9""<|close|>argument<|sep|><|open|>argument key=\"n\" type=\"number\"<|sep|>5<|close|>argument<|sep|><|open|>argument key=\"f\" type=\"number\"<|sep|>2.5<|close|>argument<|sep|><|open|>argument key=\"e\" type=\"number\"<|sep|>1000<|close|>argument<|sep|><|open|>argument key=\"b\" type=\"boolean\"<|sep|>true<|close|>argument<|sep|><|open|>argument key=\"z\" type=\"null\"<|sep|>null<|close|>argument<|sep|><|open|>argument key=\"o\" type=\"object\"<|sep|>{\"k\": [1, 2.5, \"w\"], \"a\": {}}<|close|>argument<|sep|><|open|>argument key=\"l\" type=\"array\"<|sep|>[]<|close|>argument<|sep|><|open|>argument key=\"u\" type=\"string\"<|sep|>\xc3""\xbc""<|close|>argument<|sep|><|close|>call<|sep|><|open|>call tool=\"g\" index=\"2\"<|sep|><|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"tool\" tool=\"f&quot;x\" index=\"1\"<|sep|>ra<|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"tool\" tool=\"g\" index=\"2\"<|sep|>rb<|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>";
static const char EXP_T8[] =
    "<|open|>message role=\"user\"<|sep|>Hi & \"you\"<|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>   <|close|>think<|sep|><|open|>response<|sep|>Sure<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"f\"x\" index=\"1\"<|sep|><|open|>json type=\"object\"<|sep|>{\"s\": \"x\\\"y\xc3""\xa9""\", \"n\": 5, \"f\": 2.5, \"e\": 1000, \"b\": true, \"z\": null, \"o\": {\"k\": [1, 2.5, \"w\"], \"a\": {}}, \"l\": [], \"u\": \"\xc3""\xbc""\"}<|close|>json<|sep|><|close|>call<|sep|><|open|>call tool=\"g\" index=\"2\"<|sep|><|open|>json type=\"object\"<|sep|>{}<|close|>json<|sep|><|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"tool\" index=\"1\"<|sep|>rb<|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"tool\" index=\"2\"<|sep|>ra<|close|>message<|sep|><|end_of_msg|>";
static const char EXP_T9[] =
    "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>"
    "\n"
    "<|im_user|>bob<|im_middle|>Hi & \"you\"<|im_end|>"
    "<|im_assistant|>assistant<|im_middle|>Sure<|tool_calls_section_begin|><|tool_call_begin|>functions.f\"x:0<|tool_call_argument_begin|>{\"s\": \"x\\\"y\xc3""\xa9""\", \"n\": 5, \"f\": 2.5, \"e\": 1000, \"b\": true, \"z\": null, \"o\": {\"k\": [1, 2.5, \"w\"], \"a\": {}}, \"l\": [], \"u\": \"\xc3""\xbc""\"}<|tool_call_end|><|tool_call_begin|>functions.g:1<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|><|im_end|>"
    "<|im_system|>tool<|im_middle|>## Return of functions.f\"x:0\n"
    "rb<|im_end|>"
    "<|im_system|>tool<|im_middle|>## Return of functions.g:1\n"
    "ra<|im_end|>"
    "<|im_assistant|>assistant<|im_middle|>";
static const char EXP_T10[] =
    "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>"
    "<|im_user|>user<|im_middle|>Solve it<|im_end|>"
    "<|im_assistant|>assistant<|im_middle|><think></think>a1<|im_end|>"
    "<|im_user|>user<|im_middle|>Now call f<|im_end|>"
    "<|im_assistant|>assistant<|im_middle|><think>r2</think><|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{\"q\": [1, \"two\"]}<|tool_call_end|><|tool_calls_section_end|><|im_end|>"
    "<|im_system|>f<|im_middle|>## Return of functions.f:0\n"
    "ok<|im_end|>"
    "<|im_assistant|>assistant<|im_middle|>";
static const char EXP_T11[] =
    "<|open|>message role=\"system\" type=\"thinking-effort\"<|sep|>`thinking_effort` guides on how much to think in your thinking channel (not including the response channel), supported values include `low`, `medium`, `high`, and `max`.\n"
    "Now the system is invoked with `thinking_effort=max`.<|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"user\"<|sep|>go<|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|><|close|>think<|sep|><|open|>response<|sep|>calling<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"alpha\" index=\"1\"<|sep|><|open|>argument key=\"a\" type=\"number\"<|sep|>1<|close|>argument<|sep|><|close|>call<|sep|><|open|>call tool=\"beta\" index=\"2\"<|sep|><|open|>argument key=\"b\" type=\"string\"<|sep|>x<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"tool\" tool=\"alpha\" index=\"1\"<|sep|>first<|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"tool\" tool=\"beta\" index=\"2\"<|sep|>second<|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"user\"<|sep|>and?<|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>";
static const char EXP_T12[] =
    "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>"
    "\n"
    "<|im_user|>user<|im_middle|>Hi<|im_end|>"
    "<|im_assistant|>assistant<|im_middle|>";

static const chat_tool_call m1_calls[] = {{"call_1", "get_weather", "{\"city\": \"Paris\"}"}};
static const chat_msg conv_m1[] = {
    {.role = CHAT_SYSTEM, .content = "You are helpful."},
    {.role = CHAT_USER, .content = "Hi there"},
    {.role = CHAT_ASSISTANT, .content = "Hello! How can I help?", .reasoning = "The user greets."},
    {.role = CHAT_USER, .content = "What is the weather in Paris?"},
    {.role = CHAT_ASSISTANT, .content = "", .tool_calls = m1_calls, .n_tool_calls = 1},
    {.role = CHAT_TOOL, .content = "{\"temp\": 21}", .name = "get_weather", .tool_call_id = "call_1"},
    {.role = CHAT_ASSISTANT, .content = "It is 21 degrees."},
    {.role = CHAT_USER, .content = "Thanks"},
};
/* names with characters to escape, whitespace-only reasoning, every JSON value type, results out of order */
static const chat_tool_call m6_calls[] = {
    {"a", "f\"x",
     "{\"s\": \"x\\\"y\\u00e9\", \"n\": 5, \"f\": 2.50, \"e\": 1e3, \"b\": true, \"z\": null, "
     "\"o\": {\"k\": [1, 2.5, \"w\"], \"a\": {}}, \"l\": [], \"u\": \"\xc3\xbc\"}"},
    {"b", "g", "{}"},
};
static const chat_msg conv_m6[] = {
    {.role = CHAT_USER, .content = "Hi & \"you\"", .name = "bob"},
    {.role = CHAT_ASSISTANT, .content = "Sure", .reasoning = "   ", .tool_calls = m6_calls, .n_tool_calls = 2},
    {.role = CHAT_TOOL, .content = "rb", .tool_call_id = "b"},
    {.role = CHAT_TOOL, .content = "ra", .tool_call_id = "a"},
};
static const chat_tool_call e_calls[] = {{"x1", "f", "{\"q\": [1, \"two\"]}"}};
static const chat_msg conv_e[] = {
    {.role = CHAT_USER, .content = "Solve it"},
    {.role = CHAT_ASSISTANT, .content = "a1", .reasoning = "r1"},
    {.role = CHAT_USER, .content = "Now call f"},
    {.role = CHAT_ASSISTANT, .content = "", .reasoning = "r2", .tool_calls = e_calls, .n_tool_calls = 1},
    {.role = CHAT_TOOL, .content = "ok", .name = "f", .tool_call_id = "x1"},
};
/* tool results with neither id nor name: K3 names them after the calls, in order */
static const chat_tool_call c_calls[] = {{"p", "alpha", "{\"a\": 1}"}, {"q", "beta", "{\"b\": \"x\"}"}};
static const chat_msg conv_c[] = {
    {.role = CHAT_USER, .content = "go"},
    {.role = CHAT_ASSISTANT, .content = "calling", .tool_calls = c_calls, .n_tool_calls = 2},
    {.role = CHAT_TOOL, .content = "first"},
    {.role = CHAT_TOOL, .content = "second"},
    {.role = CHAT_USER, .content = "and?"},
};
static const chat_msg conv_m2[] = {{.role = CHAT_USER, .content = "Hi"}};

#define EXP_T13 \
    "<|open|>message role=\"system\" type=\"tool-declare\"<|sep|># Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n[{\"function\":{\"description\":\"M\xc3""\xa9""t\xc3""\xa9""o \\\"now\\\"\",\"name\":\"get_weather\",\"parameters\":{\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"default\":3,\"minimum\":1,\"type\":\"integer\"},\"zoom\":{\"default\":2.5,\"type\":\"number\"}},\"required\":[\"city\"],\"type\":\"object\"}},\"type\":\"function\"},{\"function\":{\"name\":\"f\",\"parameters\":{\"properties\":{\"q\":{\"items\":{},\"type\":\"array\"}},\"type\":\"object\"}},\"type\":\"function\"}]\n```<|close|>message<|sep|><|end_of_msg|><|open|>message role=\"system\" type=\"thinking-effort\"<|sep|>`thinking_effort` guides on how much to think in your thinking channel (not including the response channel), supported values include `low`, `medium`, `high`, and `max`.\nNow the system is invoked with `thinking_effort=max`.<|close|>message<|sep|><|end_of_msg|><|open|>message role=\"user\"<|sep|>Solve it<|close|>message<|sep|><|end_of_msg|><|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>r1<|close|>think<|sep|><|open|>response<|sep|>a1<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|><|open|>message role=\"user\"<|sep|>Now call f<|close|>message<|sep|><|end_of_msg|><|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>r2<|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"f\" index=\"1\"<|sep|><|open|>argument key=\"q\" type=\"array\"<|sep|>[1, \"two\"]<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|><|open|>message role=\"tool\" tool=\"f\" index=\"1\"<|sep|>ok<|close|>message<|sep|><|end_of_msg|><|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>"
#define EXP_T14 \
    "<|open|>message role=\"system\" type=\"tool-declare\"<|sep|># Tools\n```json\n[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"M\xc3""\xa9""t\xc3""\xa9""o \\\"now\\\"\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"days\": {\"type\": \"integer\", \"minimum\": 1, \"default\": 3}, \"zoom\": {\"type\": \"number\", \"default\": 2.5}}, \"required\": [\"city\"]}}}, {\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\", \"properties\": {\"q\": {\"type\": \"array\", \"items\": {}}}}}}]\n```<|close|>message<|sep|><|end_of_msg|><|open|>message role=\"user\"<|sep|>Hi<|close|>message<|sep|><|end_of_msg|><|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>"
#define EXP_T15 \
    "<|im_system|>tool_declare<|im_middle|>[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"M\xc3""\xa9""t\xc3""\xa9""o \\\"now\\\"\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"days\": {\"type\": \"integer\", \"minimum\": 1, \"default\": 3}, \"zoom\": {\"type\": \"number\", \"default\": 2.5}}, \"required\": [\"city\"]}}}, {\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\", \"properties\": {\"q\": {\"type\": \"array\", \"items\": {}}}}}}]<|im_end|><|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>\n<|im_user|>user<|im_middle|>Hi<|im_end|><|im_assistant|>assistant<|im_middle|>"
#define EXP_T16 \
    "<|im_system|>tool_declare<|im_middle|>[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"M\xc3""\xa9""t\xc3""\xa9""o \\\"now\\\"\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"days\": {\"type\": \"integer\", \"minimum\": 1, \"default\": 3}, \"zoom\": {\"type\": \"number\", \"default\": 2.5}}, \"required\": [\"city\"]}}}, {\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\", \"properties\": {\"q\": {\"type\": \"array\", \"items\": {}}}}}}]<|im_end|><|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|><|im_user|>user<|im_middle|>Solve it<|im_end|><|im_assistant|>assistant<|im_middle|><think></think>a1<|im_end|><|im_user|>user<|im_middle|>Now call f<|im_end|><|im_assistant|>assistant<|im_middle|><think>r2</think><|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{\"q\": [1, \"two\"]}<|tool_call_end|><|tool_calls_section_end|><|im_end|><|im_system|>f<|im_middle|>## Return of functions.f:0\nok<|im_end|><|im_assistant|>assistant<|im_middle|>"
/* the tools of EXP_T13..T16, as a client sends them */
static const char tools_json[] = "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"M\xc3""\xa9""t\xc3""\xa9""o \\\"now\\\"\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"days\": {\"type\": \"integer\", \"minimum\": 1, \"default\": 3}, \"zoom\": {\"type\": \"number\", \"default\": 2.5}}, \"required\": [\"city\"]}}}, {\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\", \"properties\": {\"q\": {\"type\": \"array\", \"items\": {}}}}}}]";

typedef struct chat_case {
    const char *name;
    chat_format fmt;
    const chat_msg *msgs;
    int n;
    bool gen, thinking;
    const char *effort;
    const char *want;
    const char *tools;
} chat_case;

#define CONV(c) c, (int)(sizeof c / sizeof c[0])
static const chat_case chat_cases[] = {
    {"K3, thinking (default effort max)", CHAT_FMT_K3, CONV(conv_m1), true, true, NULL, EXP_T1, NULL},
    {"K3, thinking off, no generation prompt", CHAT_FMT_K3, CONV(conv_m1), false, false, NULL, EXP_T2, NULL},
    {"K3 lite (synth), thinking", CHAT_FMT_K3_LITE, CONV(conv_m1), true, true, NULL, EXP_T3, NULL},
    {"K3 lite (synth), thinking off", CHAT_FMT_K3_LITE, CONV(conv_m1), true, false, NULL, EXP_T4, NULL},
    {"K2 instruct", CHAT_FMT_K2, CONV(conv_m1), true, true, NULL, EXP_T5, NULL},
    {"K2 thinking", CHAT_FMT_K2_THINKING, CONV(conv_m1), true, true, NULL, EXP_T6, NULL},
    {"K3: names, escaping, argument tags, results reordered by id, effort low", CHAT_FMT_K3, CONV(conv_m6), true,
     true, "low", EXP_T7, NULL},
    {"K3 lite: arguments re-serialized like tojson", CHAT_FMT_K3_LITE, CONV(conv_m6), false, true, NULL, EXP_T8, NULL},
    {"K2 instruct: named user, default system prompt + newline, queued call ids", CHAT_FMT_K2, CONV(conv_m6), true,
     true, NULL, EXP_T9, NULL},
    {"K2 thinking: history loses its reasoning, the suffix keeps it", CHAT_FMT_K2_THINKING, CONV(conv_e), true, true,
     NULL, EXP_T10, NULL},
    {"K3: tool results named by call order", CHAT_FMT_K3, CONV(conv_c), true, true, NULL, EXP_T11, NULL},
    {"K2 instruct: one user message", CHAT_FMT_K2, CONV(conv_m2), true, true, NULL, EXP_T12, NULL},
    {"K3: tools declared (keys sorted, no blanks, non-ASCII kept), then a tool-call history", CHAT_FMT_K3,
     CONV(conv_e), true, true, NULL, EXP_T13, tools_json},
    {"K3 lite: tools declared as tojson", CHAT_FMT_K3_LITE, CONV(conv_m2), true, true, NULL, EXP_T14, tools_json},
    {"K2 instruct: tools declared before the default system prompt", CHAT_FMT_K2, CONV(conv_m2), true, true, NULL,
     EXP_T15, tools_json},
    {"K2 thinking: tools declared, then a tool-call history", CHAT_FMT_K2_THINKING, CONV(conv_e), true, true, NULL,
     EXP_T16, tools_json},
};

static void test_chat(const tok_tokenizer *t) {
    rl_err err;
    char *out;
    size_t n;
    for (size_t i = 0; i < sizeof chat_cases / sizeof chat_cases[0]; i++) {
        const chat_case *c = &chat_cases[i];
        chat_opts o = {.add_generation_prompt = c->gen, .thinking = c->thinking, .thinking_effort = c->effort,
                       .tools = c->tools};
        int rc = chat_render(c->fmt, c->msgs, c->n, &o, &out, &n, &err);
        int ok = rc == 0 && n == strlen(c->want) && strcmp(out, c->want) == 0;
        CHECK(ok, "chat %s", c->name);
        if (!ok) {
            size_t k = 0;
            while (rc == 0 && out[k] && out[k] == c->want[k]) k++;
            printf("# %s\n# first difference at byte %zu:\n# got:  %.80s\n# want: %.80s\n", rc ? err.msg : "", k,
                   rc ? "" : out + k, c->want + k);
        }
        if (rc == 0) free(out);
    }

    /* the rendered prompt tokenizes into the markers' special ids */
    chat_opts o = chat_opts_default();
    chat_render(CHAT_FMT_K3_LITE, conv_m2, 1, &o, &out, &n, &err);
    int32_t *ids;
    size_t ni;
    tok_encode(t, out, n, true, &ids, &ni, &err);
    int32_t open = tok_find(t, "<|open|>", 8), sep = tok_find(t, "<|sep|>", 7), eom = tok_find(t, "<|end_of_msg|>", 14);
    int n_open = 0, n_sep = 0, n_eom = 0;
    for (size_t i = 0; i < ni; i++) {
        n_open += ids[i] == open;
        n_sep += ids[i] == sep;
        n_eom += ids[i] == eom;
    }
    CHECK(ids[0] == open && n_open == 3 && n_sep == 4 && n_eom == 1 && ids[ni - 1] == sep,
          "a rendered prompt tokenizes (parse_special) into <|open|> x3, <|sep|> x4, <|end_of_msg|> x1");
    free(ids);
    free(out);

    /* detection */
    chat_format f;
    CHECK(chat_detect(sv_chat_template(), &f, &err) == 0 && f == CHAT_FMT_K3_LITE, "ringlm synth's template is K3 lite");
    CHECK(chat_detect("{{'<|open|>'}}{{'<|close|>'}}{{'<|end_of_msg|>'}}{% if thinking_effort %}{% endif %}", &f, &err) == 0 &&
              f == CHAT_FMT_K3,
          "a K3 template with thinking_effort is the full K3 format");
    CHECK(chat_detect("<|im_user|>user<|im_middle|>", &f, &err) == 0 && f == CHAT_FMT_K2, "<|im_middle|> is K2");
    CHECK(chat_detect("<|im_middle|><think></think>", &f, &err) == 0 && f == CHAT_FMT_K2_THINKING, "... with <think> K2 thinking");
    CHECK(chat_detect(NULL, &f, &err) == 0 && f == CHAT_FMT_K3, "no template: K3 (what llama.cpp's converter embeds)");
    CHECK(chat_detect("{% for m in messages %}<|im_start|>{{ m.content }}{% endfor %}", &f, &err) != 0 &&
              strstr(err.msg, "not a Kimi template"),
          "a ChatML template is refused: %s", err.msg);

    /* what the templates raise on */
    chat_msg orphan[] = {{.role = CHAT_USER, .content = "x"}, {.role = CHAT_TOOL, .content = "r"}};
    CHECK(chat_render(CHAT_FMT_K3, orphan, 2, &o, &out, &n, &err) != 0 && strstr(err.msg, "resolvable tool name"),
          "K3: a tool result without name or call: %s", err.msg);
    chat_tool_call arr = {"i", "f", "[1, 2]"}, notjson = {"i", "f", "{oops"};
    chat_msg a1[] = {{.role = CHAT_ASSISTANT, .content = "", .tool_calls = &arr, .n_tool_calls = 1}};
    CHECK(chat_render(CHAT_FMT_K3, a1, 1, &o, &out, &n, &err) != 0 && strstr(err.msg, "must be a mapping"),
          "K3: array arguments: %s", err.msg);
    a1[0].tool_calls = &notjson;
    CHECK(chat_render(CHAT_FMT_K3_LITE, a1, 1, &o, &out, &n, &err) != 0 && strstr(err.msg, "not valid JSON"),
          "arguments that are not JSON (llama.cpp refuses them too): %s", err.msg);
    chat_opts ot = o;
    ot.tools = "{\"type\":\"function\"}";
    CHECK(chat_render(CHAT_FMT_K2, orphan, 1, &ot, &out, &n, &err) != 0 && strstr(err.msg, "not a JSON array"),
          "tools that are not a JSON array are refused: %s", err.msg);
    ot.tools = "[]";
    int rc_empty = chat_render(CHAT_FMT_K2, orphan, 1, &ot, &out, &n, &err);
    CHECK(rc_empty == 0 && !strstr(out, "tool_declare"), "an empty tools array declares nothing");
    if (rc_empty == 0) free(out);
    chat_opts med = o;
    med.thinking_effort = "medium";
    CHECK(chat_render(CHAT_FMT_K3, conv_m2, 1, &med, &out, &n, &err) != 0 && strstr(err.msg, "thinking_effort=medium"),
          "K3: thinking_effort medium is refused like the template does: %s", err.msg);
    med.thinking_effort = "none";
    CHECK(chat_render(CHAT_FMT_K3, conv_m2, 1, &med, &out, &n, &err) == 0 &&
              strcmp(out, "<|open|>message role=\"user\"<|sep|>Hi<|close|>message<|sep|><|end_of_msg|>"
                          "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>") == 0,
          "K3: thinking_effort none drops the effort message");
    free(out);
}

/* ---- samplers ------------------------------------------------------------------------------------ */

static smp_params plain(uint64_t seed) {
    return (smp_params){.seed = seed, .temperature = 1.0f, .top_p = 1.0f, .repeat_penalty = 1.0f, .penalty_last_n = 64};
}

/* counts of sampled ids over n draws */
static void draw(smp_sampler *s, const float *lg, int n, int *count) {
    for (int i = 0; i < n; i++) count[smp_sample(s, lg)]++;
}

/* Logit biases: added first, before penalties and filters, greedy included; the sampler keeps its own copy;
 * an id outside the vocabulary or a NaN / +inf bias is refused by name. */
static void test_sampler_bias(void) {
    rl_err err;
    float lg[8] = {0.5f, 3.0f, 1.0f, 2.5f, -1.0f, 0.0f, 2.9f, 0.1f};
    smp_params p = smp_params_default(7);
    p.temperature = 0;
    smp_sampler s;
    CHECK(smp_init(&s, &p, 8, &err) == 0 && smp_sample(&s, lg) == 1, "no bias: greedy picks the highest logit (1)");
    smp_free(&s);
    smp_bias *b = malloc(2 * sizeof *b);
    b[0] = (smp_bias){1, -INFINITY};
    b[1] = (smp_bias){3, 0.5f};
    p.bias = b;
    p.n_bias = 2;
    CHECK(smp_init(&s, &p, 8, &err) == 0, "a ban and a boost are accepted");
    free(b); /* the sampler has its own copy */
    CHECK(smp_sample(&s, lg) == 3, "greedy: token 1 banned, token 3 (2.5 + 0.5) now beats token 6 (2.9)");
    size_t n;
    p.temperature = 1.0f;
    p.top_k = 0, p.top_p = 1.0f, p.min_p = 0.0f;
    smp_free(&s);
    smp_bias b2[2] = {{1, -INFINITY}, {1, 100.0f}};
    p.bias = b2;
    CHECK(smp_init(&s, &p, 8, &err) == 0, "a token listed twice is accepted");
    int hits = 0;
    for (int i = 0; i < 200; i++) hits += smp_sample(&s, lg) == 1;
    CHECK(hits == 0, "listed twice, both add: -inf + 100 still bans it (%d of 200 draws)", hits);
    smp_free(&s);
    smp_bias b3 = {5, 40.0f};
    p.bias = &b3;
    p.n_bias = 1;
    CHECK(smp_init(&s, &p, 8, &err) == 0, "one strong boost");
    hits = 0;
    for (int i = 0; i < 200; i++) hits += smp_sample(&s, lg) == 5;
    smp_filter(&s, lg, &n);
    CHECK(hits == 200 && n == 8, "sampled at temperature 1: +40 makes token 5 every draw (%d of 200)", hits);
    smp_free(&s);
    smp_bias bad = {8, 1.0f};
    p.bias = &bad;
    CHECK(smp_init(&s, &p, 8, &err) != 0 && strstr(err.msg, "token 8"), "id outside the vocabulary refused: %s", err.msg);
    bad = (smp_bias){2, NAN};
    CHECK(smp_init(&s, &p, 8, &err) != 0 && strstr(err.msg, "logit bias"), "NaN bias refused: %s", err.msg);
    bad = (smp_bias){2, INFINITY};
    CHECK(smp_init(&s, &p, 8, &err) != 0 && strstr(err.msg, "logit bias"), "+inf bias refused: %s", err.msg);
}

/* smp_logprobs: log-softmax of the raw logits, the top ones sorted (ties: lower id), NaN as -inf, a
 * vocabulary smaller than SMP_TOP_LOGPROBS padded with id -1. */
static void test_logprobs(void) {
    float lg[6] = {1.0f, 3.0f, NAN, 3.0f, -2.0f, 0.5f};
    smp_logprob lp;
    smp_logprobs(lg, 6, 4, &lp);
    double z = exp(1.0) + 2 * exp(3.0) + exp(-2.0) + exp(0.5);
    CHECK(fabs(lp.logprob - (-2.0 - log(z))) < 1e-6, "the token's logprob is its log-softmax (%g)", lp.logprob);
    CHECK(lp.top_id[0] == 1 && lp.top_id[1] == 3 && lp.top_id[2] == 0 && lp.top_id[3] == 5 && lp.top_id[4] == 4 &&
              lp.top_id[5] == 2, "top ones sorted, a tie to the lower id, NaN last");
    CHECK(lp.top_logprob[5] == -INFINITY && lp.top_id[6] == -1 && lp.top_id[SMP_TOP_LOGPROBS - 1] == -1,
          "NaN has logprob -inf; past the vocabulary: id -1");
    double sum = 0;
    for (int k = 0; k < 6; k++) sum += exp(lp.top_logprob[k]);
    CHECK(fabs(sum - 1) < 1e-6, "the probabilities sum to 1 (%g)", sum);
    float big[100];
    for (int i = 0; i < 100; i++) big[i] = (float)((i * 37) % 100) / 10.0f;
    smp_logprobs(big, 100, 7, &lp);
    bool sorted = true;
    for (int k = 1; k < SMP_TOP_LOGPROBS; k++) sorted = sorted && lp.top_logprob[k] <= lp.top_logprob[k - 1];
    CHECK(sorted && big[lp.top_id[0]] == 9.9f && big[lp.top_id[SMP_TOP_LOGPROBS - 1]] == 8.0f,
          "100 tokens: the 20 highest, in order (9.9 down to 8.0)");
}

/* chat_split: a K3 reply's framing followed token by token; the section names never reach a channel. */
static void split_run3(const tok_tokenizer *t, chat_format fmt, bool thinking, const char *reply, char *reason,
                       char *content, char *tools) {
    int32_t *ids = NULL;
    size_t n = 0;
    rl_err err;
    reason[0] = content[0] = tools[0] = 0;
    if (tok_encode(t, reply, strlen(reply), true, &ids, &n, &err) != 0) return;
    chat_split sp;
    chat_split_init(&sp, t, true, fmt, thinking);
    for (size_t i = 0; i < n; i++) {
        const char *p;
        size_t len;
        chat_chan ch = chat_split_push(&sp, t, ids[i]);
        if (ch == CHAT_CH_NONE || tok_piece(t, ids[i], ch == CHAT_CH_TOOLS, &p, &len) != 0) continue;
        strncat(ch == CHAT_CH_REASONING ? reason : ch == CHAT_CH_TOOLS ? tools : content, p, len);
    }
    free(ids);
}

static void split_run(const tok_tokenizer *t, chat_format fmt, bool thinking, const char *reply, char *reason,
                      char *content) {
    char tools[512];
    split_run3(t, fmt, thinking, reply, reason, content, tools);
    strcat(content, tools);
}

static void test_chat_split(const tok_tokenizer *t) {
    char r[256], c[256], tl[512];
    split_run(t, CHAT_FMT_K3_LITE, true, "plan it<|close|>think<|sep|><|open|>response<|sep|>Hello<|close|>response<|sep|>", r, c);
    CHECK(strcmp(r, "plan it") == 0 && strcmp(c, "Hello") == 0, "thinking: reasoning '%s', content '%s'", r, c);
    split_run(t, CHAT_FMT_K3, false, "Hi there<|close|>response<|sep|>", r, c);
    CHECK(!*r && strcmp(c, "Hi there") == 0, "not thinking: the reply is content '%s'", c);
    split_run(t, CHAT_FMT_K3_LITE, true, "a<|close|>think<|sep|>stray<|open|>other<|sep|>call<|close|>other<|sep|>", r, c);
    CHECK(strcmp(r, "a") == 0 && strcmp(c, "straycall") == 0, "text between sections and an unknown section: content '%s'", c);
    split_run3(t, CHAT_FMT_K3, true, "a<|close|>think<|sep|><|open|>response<|sep|>ok<|close|>response<|sep|><|open|>tools<|sep|>"
               "<|open|>call tool=\"f\" index=\"1\"<|sep|><|open|>argument key=\"x\" type=\"string\"<|sep|>tools<|close|>argument<|sep|>"
               "<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|>", r, c, tl);
    CHECK(strcmp(r, "a") == 0 && strcmp(c, "ok") == 0 &&
          strcmp(tl, "<|open|>call tool=\"f\" index=\"1\"<|sep|><|open|>argument key=\"x\" type=\"string\"<|sep|>tools"
                     "<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>") == 0,
          "the tools section, nested framing and all, goes to the tools channel up to its own closer: '%s'", tl);
    split_run(t, CHAT_FMT_K2, true, "x<|close|>think<|sep|>y", r, c);
    CHECK(!*r && strcmp(c, "xthinky") == 0, "a format it does not split: everything is content '%s'", c);
}

/* chat_tools_parse: whole sections, prefixes (more may come) and malformed ones */
static void test_tools_parse(void) {
    chat_call calls[CHAT_MAX_CALLS];
    int n;
    static const char whole[] = "<|open|>call tool=\"get_&quot;w&amp;\" index=\"1\"<|sep|><|open|>argument key=\"city\" type=\"string\"<|sep|>"
                                "Paris \"x\"<|close|>argument<|sep|><|open|>argument key=\"days\" type=\"number\"<|sep|>3<|close|>argument<|sep|>"
                                "<|close|>call<|sep|>\n<|open|>call tool=\"f\" index=\"2\"<|sep|><|open|>json type=\"object\"<|sep|>"
                                "{\"q\": [1, \"two\"]}<|close|>json<|sep|><|close|>call<|sep|><|close|>tools<|sep|>";
    int rc = chat_tools_parse(whole, strlen(whole), calls, &n);
    CHECK(rc == 1 && n == 2 && strcmp(calls[0].name, "get_\"w&") == 0 &&
          strcmp(calls[0].arguments, "{\"city\":\"Paris \\\"x\\\"\",\"days\":3}") == 0 && strcmp(calls[1].name, "f") == 0 &&
          strcmp(calls[1].arguments, "{\"q\":[1,\"two\"]}") == 0,
          "two calls: attributes unescaped, a raw string and a number argument, a JSON block (%d, %d calls)", rc, n);
    chat_calls_free(calls, n);
    int prefixes = 0;
    for (size_t k = 0; k < strlen(whole); k++) {
        int r = chat_tools_parse(whole, k, calls, &n);
        prefixes += r == 0;
        chat_calls_free(calls, n);
    }
    CHECK(prefixes == (int)strlen(whole), "every prefix of the section reads as one that may go on (%d of %zu)", prefixes, strlen(whole));
    static const char *const bad[] = {
        "<|open|>call index=\"1\"<|sep|><|close|>call<|sep|>", /* no tool name */
        "<|open|>call tool=\"f\"<|sep|><|open|>argument key=\"n\" type=\"number\"<|sep|>x1<|close|>argument<|sep|>",
        "<|open|>call tool=\"f\"<|sep|><|open|>json type=\"object\"<|sep|>[1]<|close|>json<|sep|>",
        "<|open|>call tool=\"f\"<|sep|>junk<|close|>call<|sep|>", "hello", "<|close|>toolz<|sep|>",
    };
    int refused = 0;
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        refused += chat_tools_parse(bad[i], strlen(bad[i]), calls, &n) == -1;
        chat_calls_free(calls, n);
    }
    char many[2048] = "";
    for (int i = 0; i <= CHAT_MAX_CALLS; i++) strcat(many, "<|open|>call tool=\"f\"<|sep|><|close|>call<|sep|>");
    int rc_many = chat_tools_parse(many, strlen(many), calls, &n);
    CHECK(rc_many == -1 && n == CHAT_MAX_CALLS, "a section of %d calls is refused after the %d it holds (%d)", CHAT_MAX_CALLS + 1,
          CHAT_MAX_CALLS, n);
    chat_calls_free(calls, n);
    CHECK(refused == (int)(sizeof bad / sizeof *bad), "malformed sections refused (no name, a number that is not JSON, a "
          "JSON block that is no object, text between tags, text, a wrong closer): %d of %zu", refused, sizeof bad / sizeof *bad);
}

/* Replaces the grammar's symbol bytes by the markers they stand for. */
static void unsym(const char *in, size_t n, char *out) {
    static const char *const m[3] = {"<|open|>", "<|sep|>", "<|close|>"};
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)in[i];
        if (c >= 0xF8 && c <= 0xFA) strcpy(out + k, m[c - 0xF8]), k += strlen(m[c - 0xF8]);
        else out[k++] = in[i];
    }
    out[k] = 0;
}

/* A random sentence of g: random allowed bytes for up to `steps`, then a shortest completion. */
static size_t gram_walk(const gr_grammar *g, uint64_t *rng, int steps, char *out, size_t cap) {
    gr_state st, tmp = {0};
    if (gr_state_init(g, &st)) return 0;
    size_t n = 0;
    for (int s = 0; s < steps && n + 1 < cap / 2; s++) {
        unsigned char ok[256];
        int k = 0;
        for (int b = 0; b < 256; b++) {
            char c = (char)b;
            if (gr_state_copy(&tmp, &st) == 0 && gr_feed(g, &tmp, &c, 1)) ok[k++] = (unsigned char)b;
        }
        *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
        if (k == 0 || (gr_done(g, &st) && (*rng >> 33) % 4 == 0)) break;
        char c = (char)ok[(*rng >> 33) % (uint64_t)k];
        gr_feed(g, &st, &c, 1);
        out[n++] = c;
    }
    size_t m = gr_close(g, &st, out + n, cap - n);
    gr_state_free(&st);
    gr_state_free(&tmp);
    return m == SIZE_MAX ? 0 : n + m;
}

/* tool_choice required: every sentence of the grammar is a reply whose tools section parses into calls
 * of declared tools with arguments matching their schemas (K3's argument tags, K3 lite's JSON block). */
static void test_tools_grammar(void) {
    rl_err err;
    cJSON *tools = cJSON_Parse("[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
                               "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},\"unit\":{\"enum\":[\"c\",\"f\"]}},"
                               "\"required\":[\"city\"]}}},{\"type\":\"function\",\"function\":{\"name\":\"ping\"}}]");
    static const chat_format fmts[2] = {CHAT_FMT_K3, CHAT_FMT_K3_LITE};
    for (int fi = 0; fi < 2; fi++) {
        for (int th = 0; th < 2; th++) {
            gr_grammar *g = chat_tools_grammar_new(fmts[fi], tools, fi == 1 && th == 1 ? "ping" : NULL, th, false, &err);
            if (!g) {
                CHECK(false, "tool grammar builds: %s", err.msg);
                continue;
            }
            uint64_t rng = 7 + (uint64_t)(fi * 2 + th);
            int good = 0, walks = 40;
            char raw[4096], text[8192];
            for (int w = 0; w < walks; w++) {
                size_t n = gram_walk(g, &rng, w * 6, raw, sizeof raw);
                unsym(raw, n, text);
                const char *sec = strstr(text, "<|open|>tools<|sep|>");
                chat_call calls[CHAT_MAX_CALLS];
                int nc = 0, rc = sec ? chat_tools_parse(sec + 20, strlen(sec + 20) - strlen("<|close|>message<|sep|>"), calls, &nc) : -2;
                bool ok = rc == 1 && nc >= 1 && strstr(text, th ? "<|close|>think<|sep|>" : "<|close|>response<|sep|>");
                for (int c = 0; ok && c < nc; c++) {
                    cJSON *a = cJSON_Parse(calls[c].arguments);
                    if (!strcmp(calls[c].name, "get_weather") && !(fi == 1 && th == 1)) {
                        const cJSON *city = cJSON_GetObjectItemCaseSensitive(a, "city"), *d = cJSON_GetObjectItemCaseSensitive(a, "days"),
                                    *u = cJSON_GetObjectItemCaseSensitive(a, "unit");
                        ok = cJSON_IsString(city) && (!d || (cJSON_IsNumber(d) && d->valuedouble == (double)(long long)d->valuedouble)) &&
                             (!u || (cJSON_IsString(u) && (!strcmp(u->valuestring, "c") || !strcmp(u->valuestring, "f"))));
                    } else {
                        ok = !strcmp(calls[c].name, "ping") && cJSON_IsObject(a);
                    }
                    cJSON_Delete(a);
                }
                if (!ok) fprintf(stderr, "  walk %d (rc %d, %d calls): %.300s\n", w, rc, nc, text);
                good += ok;
                chat_calls_free(calls, nc);
            }
            CHECK(good == walks, "%s, thinking %s%s: %d random sentences of the grammar all parse into valid calls (%d)",
                  chat_format_name(fmts[fi]), th ? "on" : "off", fi == 1 && th == 1 ? ", only 'ping'" : "", walks, good);
            gr_free(g);
        }
    }
    CHECK(!chat_tools_grammar_new(CHAT_FMT_K3, tools, "nope", true, false, &err) && strstr(err.msg, "'nope'"),
          "a named tool that is not declared is refused: %s", err.msg);
    CHECK(!chat_tools_grammar_new(CHAT_FMT_K2, tools, NULL, true, false, &err) && strstr(err.msg, "kimi-k2"),
          "K2 formats cannot be made to call: %s", err.msg);
    cJSON_Delete(tools);
}

/* Feeds doc to a fresh state of g: 1 whole, 0 a prefix only, -1 refused. */
static int gram_feed(const gr_grammar *g, const char *doc) {
    gr_state st;
    if (gr_state_init(g, &st)) return -2;
    int r = !gr_feed(g, &st, doc, strlen(doc)) ? -1 : gr_done(g, &st) ? 1 : 0;
    gr_state_free(&st);
    return r;
}

/* Every prefix of doc is accepted, and closes by gr_close into a whole sentence exactly gr_close_len
 * bytes long. */
static bool gram_prefixes_close(const gr_grammar *g, const char *doc) {
    bool ok = true;
    for (size_t k = 0; k <= strlen(doc) && ok; k++) {
        gr_state p;
        if (gr_state_init(g, &p)) return false;
        char c[512];
        size_t n = SIZE_MAX, want = SIZE_MAX;
        if (gr_feed(g, &p, doc, k)) {
            want = gr_close_len(g, &p);
            n = gr_close(g, &p, c, sizeof c);
        }
        ok = n != SIZE_MAX && n == want && gr_feed(g, &p, c, n) && gr_done(g, &p);
        if (!ok) fprintf(stderr, "  prefix %zu of %s: close %zu (len %zu)\n", k, doc, n, want);
        gr_state_free(&p);
    }
    return ok;
}

static gr_grammar *schema_grammar(const char *text, rl_err *err) {
    cJSON *j = cJSON_Parse(text);
    gr_grammar *g = j ? js_grammar_new(j, false, err) : NULL;
    cJSON_Delete(j);
    return g;
}

/* json_object: whole objects are done, every prefix of one is accepted and closes into a whole one;
 * what no JSON object can continue with is refused. */
static void test_json_object_grammar(void) {
    rl_err err;
    gr_grammar *g = js_object_grammar_new(&err);
    CHECK(g != NULL, "the json_object grammar builds: %s", g ? "" : err.msg);
    if (!g) return;
    static const char *const ok_docs[] = {
        "{}", "{\"a\":1}", "{\"a\" : [1, -2.5e+3, true, null, \"x\\u00e9\\n\"], \"b\":{\"c\":{}}}",
        "{\"k\":\"\xc3\xa9\",\"z\":[[],[{}]],\"n\":0.25E-1}", "{\n  \"a\": [\n    1\n  ]\n}",
    };
    int whole = 0, closing = 0;
    const int n_ok = (int)(sizeof ok_docs / sizeof *ok_docs);
    for (int d = 0; d < n_ok; d++) {
        whole += gram_feed(g, ok_docs[d]) == 1;
        closing += gram_prefixes_close(g, ok_docs[d]);
    }
    CHECK(whole == n_ok, "whole JSON objects are done (%d of %d)", whole, n_ok);
    CHECK(closing == n_ok, "every prefix accepted and closed by a shortest completion of gr_close_len bytes (%d of %d)",
          closing, n_ok);
    static const char *const bad[] = {"[1]", "{1:2}", "{\"a\" 1}", "{\"a\":tru3}", "{\"a\":01}", "{\"a\":1,}",
                                      "{\"a\":\"\\x\"}", "{}x", "{\"a\":\"\n\"}", "{\"a\":-}", "{\"a\":1]",
                                      "{\"a\":\"\\u12g4\"}", " {}", "{  \"a\":1}", "{\"a\":\"\xf8\"}",
                                      "{\"a\":\"\xe0\x80\x80\"}", "{\"a\":\"\xed\xa0\x80\"}", "{\"a\":\"\xf4\x90\x80\x80\"}"};
    int refused = 0;
    for (size_t d = 0; d < sizeof bad / sizeof *bad; d++) refused += gram_feed(g, bad[d]) == -1;
    CHECK(refused == (int)(sizeof bad / sizeof *bad), "not JSON objects (an array, bad keys, literals, numbers, escapes, "
          "trailing text, raw newlines, runs of blanks, a special-token byte, overlong UTF-8, a surrogate, past U+10FFFF) refused: %d of %zu", refused,
          sizeof bad / sizeof *bad);
    char deep[2 * GR_MAX_FRAMES + 16] = "{\"a\":";
    size_t bl = strlen(deep);
    while (bl < sizeof deep - 1) deep[bl++] = '[';
    deep[bl] = 0;
    CHECK(gram_feed(g, deep) == -1 && gram_feed(g, "{\"a\":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}") == 1,
          "nesting 32 deep is fine, %d deep refused (the parse stack is bounded)", 2 * GR_MAX_FRAMES);
    gr_free(g);
}

/* JSON schemas: matching texts are whole (and every prefix closes), the rest refused; keywords the grammar
 * cannot enforce are refused by name. */
static void test_json_schema(void) {
    rl_err err;
    static const struct {
        const char *schema;
        const char *ok[4];
        const char *bad[6];
    } cases[] = {
        {"{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"},"
         "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}}},\"required\":[\"name\",\"age\"],"
         "\"additionalProperties\":false}",
         {"{\"name\":\"Ann\",\"age\":41}", "{\"name\": \"B\", \"age\": -3, \"tags\": [\"x\", \"y\"]}",
          "{ \"name\":\"\",\"age\":0,\"tags\":[] }"},
         {"{\"age\":41,\"name\":\"Ann\"}", "{\"name\":\"Ann\"}", "{\"name\":\"Ann\",\"age\":4.5}",
          "{\"name\":\"Ann\",\"age\":1,\"x\":1}", "{\"name\":1,\"age\":1}", "{\"name\":\"A\",\"age\":1,\"tags\":[1]}"}},
        {"{\"enum\":[\"red\",\"green\",3,null]}", {"\"red\"", "\"green\"", "3", "null"},
         {"\"blue\"", "\"re\"", "4", "\"red\"x"}},
        {"{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"minItems\":2,\"maxItems\":3}",
         {"[true,false]", "[true, true, false]"}, {"[]", "[true]", "[true,true,true,true]", "[1,2]"}},
        {"{\"type\":\"object\",\"properties\":{\"when\":{\"type\":\"string\",\"format\":\"date-time\"},"
         "\"id\":{\"type\":\"string\",\"format\":\"uuid\"},\"d\":{\"type\":\"string\",\"format\":\"date\"}},"
         "\"additionalProperties\":false}",
         {"{\"when\":\"2026-12-02T09:20:55Z\"}", "{\"id\":\"123e4567-e89b-12d3-a456-426614174000\",\"d\":\"2026-02-28\"}",
          "{}", "{\"when\":\"2026-12-02T09:20:55.5+01:00\"}"},
         {"{\"when\":\"2026-13-02T09:20:55Z\"}", "{\"d\":\"2026-1-2\"}", "{\"id\":\"123\"}", "{\"d\":\"2026-02-28T\"}"}},
        {"{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"number\"},\"kids\":{\"type\":"
         "\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},\"required\":[\"v\"],\"additionalProperties\":false}},"
         "\"$ref\":\"#/$defs/node\"}",
         {"{\"v\":1}", "{\"v\":1.5e3,\"kids\":[{\"v\":2},{\"v\":3,\"kids\":[{\"v\":-0.5}]}]}",
          "{\"v\":123456789012345.1234567890123456e-123}"},
         {"{\"kids\":[]}", "{\"v\":1,\"kids\":[{}]}", "{\"v\":\"1\"}", "{\"v\":1234567890123456}",
          "{\"v\":1.12345678901234567}", "{\"v\":1e1234}"}},
        {"{\"anyOf\":[{\"type\":\"string\",\"maxLength\":3},{\"type\":[\"integer\",\"null\"]}]}",
         {"\"abc\"", "\"\\u00e9\"", "12", "null"}, {"\"abcd\"", "1.5", "true"}},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"const\":\"x\"}},\"additionalProperties\":{\"type\":\"integer\"}}",
         {"{\"a\":\"x\",\"n\":1}", "{\"n\":1,\"m\":2}", "{}"}, {"{\"a\":\"y\"}", "{\"n\":\"s\"}"}},
    };
    int n_cases = (int)(sizeof cases / sizeof *cases), good = 0;
    for (int i = 0; i < n_cases; i++) {
        gr_grammar *g = schema_grammar(cases[i].schema, &err);
        if (!g) {
            fprintf(stderr, "  schema %d: %s\n", i, err.msg);
            continue;
        }
        bool ok = true;
        for (int k = 0; k < 4 && cases[i].ok[k]; k++) {
            bool w = gram_feed(g, cases[i].ok[k]) == 1 && gram_prefixes_close(g, cases[i].ok[k]);
            if (!w) fprintf(stderr, "  schema %d: '%s' not accepted\n", i, cases[i].ok[k]);
            ok = ok && w;
        }
        for (int k = 0; k < 6 && cases[i].bad[k]; k++) {
            bool r = gram_feed(g, cases[i].bad[k]) != 1;
            if (!r) fprintf(stderr, "  schema %d: '%s' accepted\n", i, cases[i].bad[k]);
            ok = ok && r;
        }
        good += ok;
        gr_free(g);
    }
    CHECK(good == n_cases, "schemas (properties in order, required, additionalProperties, enum, min/maxItems, formats, "
          "recursive $ref, number digits bounded, anyOf, type lists, const) accept what matches and nothing else: %d of %d", good, n_cases);
    static const struct {
        const char *schema, *msg;
    } refuse[] = {
        {"{\"type\":\"string\",\"pattern\":\"^a\"}", "'pattern' is not supported"},
        {"{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\",\"minimum\":0}}}", "/properties/n"},
        {"{\"$ref\":\"#/$defs/missing\"}", "does not resolve"},
        {"{\"$ref\":\"https://example.com/s.json\"}", "only local references"},
        {"{\"type\":\"strin\"}", "unknown type 'strin'"},
        {"{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", "maxItems is below minItems"},
        {"false", "matches nothing"},
        {"{\"type\":\"object\",\"required\":[\"a\"],\"additionalProperties\":false}", "required property 'a'"},
        {"{\"$defs\":{\"a\":{\"$ref\":\"#/$defs/a\"}},\"$ref\":\"#/$defs/a\"}", "no finite text"},
        {"{\"anyOf\":[{\"$ref\":\"#\"},{\"$ref\":\"#\"},{\"type\":\"string\"}]}", "left recursion"},
    };
    int named = 0;
    for (size_t i = 0; i < sizeof refuse / sizeof *refuse; i++) {
        err.msg[0] = 0;
        gr_grammar *g = schema_grammar(refuse[i].schema, &err);
        bool ok = !g && strstr(err.msg, refuse[i].msg);
        if (!ok) fprintf(stderr, "  %s: '%s'\n", refuse[i].schema, err.msg);
        named += ok;
        gr_free(g);
    }
    CHECK(named == (int)(sizeof refuse / sizeof *refuse), "unsupported or impossible schemas refused, naming why: %d of %zu",
          named, sizeof refuse / sizeof *refuse);
}

static void test_sampler(void) {
    rl_err err;
    smp_sampler s, s2;
    smp_params p;

    float lg[6] = {0.5f, 2.0f, -1.0f, 1.99f, NAN, 0.0f};
    p = plain(1);
    p.temperature = 0.0f;
    smp_init(&s, &p, 6, &err);
    CHECK(smp_sample(&s, lg) == 1, "greedy (temperature 0) picks the argmax; NaN counts as -inf");
    smp_free(&s);
    p.temperature = 1e-7f;
    smp_init(&s, &p, 6, &err);
    int cnt[6] = {0};
    draw(&s, lg, 200, cnt);
    CHECK(cnt[1] == 200, "temperature -> 0 behaves as greedy (200/200 draws)");
    smp_free(&s);
    float tie[3] = {1.0f, 3.0f, 3.0f};
    p.temperature = 0.0f;
    smp_init(&s, &p, 3, &err);
    CHECK(smp_sample(&s, tie) == 1, "greedy ties go to the lower id");
    smp_free(&s);

    /* top-k = 1 is greedy, on random rows */
    enum { V = 50000 };
    float *row = malloc(V * sizeof *row);
    uint64_t r = 7;
    int same = 1;
    p = plain(3);
    p.top_k = 1;
    smp_init(&s, &p, V, &err);
    for (int rep = 0; rep < 20; rep++) {
        int best = 0;
        for (int i = 0; i < V; i++) {
            r = r * 6364136223846793005ULL + 1442695040888963407ULL;
            row[i] = (float)((r >> 40) % 100000) / 1000.0f;
            if (row[i] > row[best]) best = i;
        }
        same &= smp_sample(&s, row) == best;
    }
    smp_free(&s);
    CHECK(same, "top-k 1 equals greedy on 20 random rows of %d", V);

    /* top-k selects exactly the k best (quickselect vs a full sort) */
    p = plain(3);
    p.top_k = 40;
    smp_init(&s, &p, V, &err);
    size_t nk;
    smp_filter(&s, row, &nk);
    int kth_ok = nk == 40;
    for (size_t i = 0; i + 1 < nk; i++) kth_ok &= s.cand[i].logit >= s.cand[i + 1].logit;
    int above = 0; /* how many logits are strictly above the 40th kept one: must be < 40 */
    for (int i = 0; i < V; i++) above += row[i] > s.cand[nk - 1].logit;
    CHECK(kth_ok && above < 40, "top-k 40 keeps the 40 highest, sorted");
    smp_free(&s);
    free(row);

    /* same seed, same tokens; another seed, other tokens */
    float flat[16];
    for (int i = 0; i < 16; i++) flat[i] = (float)(i % 4) * 0.1f;
    p = plain(42);
    smp_init(&s, &p, 16, &err);
    smp_init(&s2, &p, 16, &err);
    int eq = 1;
    int32_t seq1[200];
    for (int i = 0; i < 200; i++) {
        seq1[i] = smp_sample(&s, flat);
        eq &= seq1[i] == smp_sample(&s2, flat);
    }
    CHECK(eq, "same seed: the same 200 tokens");
    smp_free(&s2);
    p.seed = 43;
    smp_init(&s2, &p, 16, &err);
    int diff = 0;
    for (int i = 0; i < 200; i++) diff += seq1[i] != smp_sample(&s2, flat);
    CHECK(diff > 50, "another seed: another sequence (%d of 200 differ)", diff);
    smp_reset(&s);
    eq = 1;
    for (int i = 0; i < 200; i++) eq &= seq1[i] == smp_sample(&s, flat);
    CHECK(eq, "reset restarts the RNG from the seed");
    smp_free(&s);
    smp_free(&s2);

    /* top-p and min-p cut the tail: p = 0.5, 0.3, 0.15, 0.05 */
    float pr[4] = {logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f)};
    int c4[4] = {0};
    size_t nf;
    p = plain(5);
    p.top_p = 0.75f;
    smp_init(&s, &p, 4, &err);
    smp_filter(&s, pr, &nf);
    draw(&s, pr, 3000, c4);
    CHECK(nf == 2 && c4[2] == 0 && c4[3] == 0 && c4[0] > c4[1] && c4[1] > 0,
          "top-p 0.75 keeps {0.5, 0.3}: draws %d %d %d %d", c4[0], c4[1], c4[2], c4[3]);
    smp_free(&s);
    p = plain(5);
    p.min_p = 0.2f;
    memset(c4, 0, sizeof c4);
    smp_init(&s, &p, 4, &err);
    smp_filter(&s, pr, &nf);
    draw(&s, pr, 3000, c4);
    CHECK(nf == 3 && c4[3] == 0 && c4[2] > 0, "min-p 0.2 drops p < 0.1 only: draws %d %d %d %d", c4[0], c4[1], c4[2], c4[3]);
    smp_free(&s);
    p = plain(5);
    p.top_p = 0.9f;
    p.temperature = 100.0f; /* flattening after the cut must not bring the tail back */
    memset(c4, 0, sizeof c4);
    smp_init(&s, &p, 4, &err);
    draw(&s, pr, 3000, c4);
    CHECK(c4[3] == 0 && c4[2] > 700, "top-p runs before temperature: draws %d %d %d %d", c4[0], c4[1], c4[2], c4[3]);
    smp_free(&s);

    /* penalties */
    float pen[4] = {2.0f, 1.9f, -1.0f, -1.1f};
    p = plain(1);
    p.temperature = 0.0f;
    p.repeat_penalty = 1.5f;
    smp_init(&s, &p, 4, &err);
    CHECK(smp_sample(&s, pen) == 0, "no history: no penalty");
    smp_accept(&s, 0);
    CHECK(smp_sample(&s, pen) == 1, "repeat penalty 1.5: 2.0 / 1.5 < 1.9, token 1 wins");
    smp_accept(&s, 2);
    s.p.temperature = 1.0f;
    s.p.top_k = 4; /* to read the order */
    smp_filter(&s, pen, &nf);
    CHECK(nf == 4 && s.cand[0].id == 1 && s.cand[1].id == 0 && s.cand[2].id == 3 && s.cand[3].id == 2 &&
              fabsf(s.cand[3].logit + 1.5f) < 1e-6f,
          "a negative logit is multiplied: -1.0 * 1.5 falls below -1.1");
    smp_free(&s);
    float pp[2] = {2.0f, 1.5f};
    p = plain(1);
    p.temperature = 0.0f;
    p.presence_penalty = 1.0f;
    p.penalty_last_n = 2;
    smp_init(&s, &p, 2, &err);
    smp_accept(&s, 0);
    CHECK(smp_sample(&s, pp) == 1, "presence penalty 1.0: 2.0 - 1 < 1.5");
    smp_accept(&s, 1);
    smp_accept(&s, 1);
    CHECK(smp_sample(&s, pp) == 0, "a token older than penalty_last_n (2) is no longer penalized");
    smp_free(&s);
    p.presence_penalty = 0.0f;
    p.frequency_penalty = 0.3f;
    p.penalty_last_n = -1;
    smp_init(&s, &p, 2, &err);
    smp_accept(&s, 0);
    CHECK(smp_sample(&s, pp) == 0, "frequency penalty 0.3 x 1: 1.7 still beats 1.5");
    smp_accept(&s, 0);
    CHECK(smp_sample(&s, pp) == 1, "frequency penalty 0.3 x 2: 1.4 loses to 1.5 (window -1 = all)");
    smp_free(&s);
    p = plain(1);
    p.repeat_penalty = 0.0f;
    CHECK(smp_init(&s, &p, 2, &err) != 0 && strstr(err.msg, "repeat_penalty"), "a zero repeat penalty is refused: %s", err.msg);
}

/* Constrained sampling on a vocabulary of 8 tokens and the grammar [ab]+ "c": smp_dist is the distribution
 * smp_sample draws from (masking included), speculative acceptance keeps that distribution whether the
 * draft is allowed or refused (and never keeps a refused one), smp_grammar_prefix cuts a drafted block at
 * the first token the grammar or the budget refuses, and the budget forces the sentence to close. */
static void test_grammar_sampling(void) {
    enum { NV = 8 };
    static const char *const piece[NV] = {"a", "b", "c", "ab", "ca", "x", "", ""};
    const uint32_t len[NV] = {1, 1, 1, 2, 2, 1, 0, 0};
    const uint8_t eog[NV] = {0, 0, 0, 0, 0, 0, 1, 0}; /* 6 ends generation; 7 is a control token */
    const smp_vocab v = {.n = NV, .piece = piece, .len = len, .eog = eog};
    gr_builder *b = gr_builder_new();
    uint8_t ab[32];
    gr_set_clear(ab);
    gr_set_add(ab, 'a', 'b');
    int root = gr_rule_new(b), more = gr_rule_new(b);
    gr_alt_add(b, more, (gr_item[]){{.kind = GR_SET, .set = ab}, {.kind = GR_RULE, .rule = more}}, 2);
    gr_alt_add(b, more, NULL, 0);
    gr_alt_add(b, root, (gr_item[]){{.kind = GR_SET, .set = ab}, {.kind = GR_RULE, .rule = more}, {.kind = GR_LIT, .lit = "c"}}, 3);
    rl_err err;
    gr_grammar *g = gr_build(b, root, &err);
    gr_builder_free(b);
    CHECK(g != NULL, "the grammar [ab]+ \"c\" builds");
    if (!g) return;
    /* The refused tokens ("c" first, "ca", "x", the end, the control token) hold most of the mass. */
    const float lg[NV] = {0.2f, -0.5f, 2.0f, 0.1f, 1.5f, 1.8f, 1.0f, 2.5f};
    smp_params p = plain(1);
    p.grammar = g;
    p.vocab = &v;
    smp_sampler s;
    CHECK(smp_init(&s, &p, NV, &err) == 0, "a constrained sampler starts");
    double want[NV] = {0};
    size_t n = smp_dist(&s, lg);
    double sum = 0;
    for (size_t i = 0; i < n; i++) want[s.cand[i].id] += s.cand[i].p, sum += s.cand[i].p;
    CHECK(fabs(sum - 1) < 1e-5 && want[2] == 0 && want[4] == 0 && want[5] == 0 && want[6] == 0 && want[7] == 0 &&
              want[0] > 0 && want[1] > 0 && want[3] > 0,
          "smp_dist: mass 1 (%.6f), all of it on the tokens the grammar allows first (a %.3f, b %.3f, ab %.3f)", sum,
          want[0], want[1], want[3]);
    smp_free(&s);
    /* 20000 draws each: plain constrained sampling, acceptance of an allowed draft ("a"), of a refused one
     * ("x"); every frequency within 4.5 sigma of smp_dist's. */
    const int N = 20000;
    const int32_t drafts[2] = {0, 5};
    int cnt[3][NV] = {{0}}, kept[2] = {0};
    bool refused_kept = false;
    for (int i = 0; i < N; i++) {
        p.seed = 1000 + (uint64_t)i;
        if (smp_init(&s, &p, NV, &err) != 0) break;
        cnt[0][smp_sample(&s, lg)]++;
        smp_free(&s);
        for (int d = 0; d < 2; d++) {
            if (smp_init(&s, &p, NV, &err) != 0) break;
            /* block [last, draft]: the row judging the draft is the first; the second (a bonus) is not reached
             * unless the draft is kept */
            float rows[2 * NV];
            memcpy(rows, lg, sizeof lg);
            memcpy(rows + NV, lg, sizeof lg);
            int32_t blk[2] = {7, drafts[d]}, out[2];
            int no = spec_accept(&s, rows, NV, blk, 1, NULL, out);
            cnt[1 + d][out[0]]++;
            kept[d] += no == 2;
            refused_kept |= d == 1 && out[0] == 5;
            smp_free(&s);
        }
    }
    for (int k = 0; k < 3; k++) {
        double worst = 0;
        for (int i = 0; i < NV; i++) {
            double sd = sqrt(N * want[i] * (1 - want[i])) + 1e-9, z = fabs(cnt[k][i] - N * want[i]) / sd;
            if (want[i] == 0) z = cnt[k][i] ? INFINITY : 0;
            worst = z > worst ? z : worst;
        }
        static const char *const what[3] = {"plain constrained sampling", "acceptance of an allowed draft",
                                             "acceptance of a refused draft"};
        CHECK(worst < 4.5, "%s draws smp_dist's distribution (worst deviation %.2f sigma)", what[k], worst);
    }
    CHECK(!refused_kept && kept[1] == 0 && kept[0] > N / 4 && kept[0] < N,
          "a refused draft is never kept; an allowed one sometimes (%d of %d)", kept[0], N);
    /* A budget no token can keep (1: every sentence takes two tokens, "a" "c" at least) is dropped rather
     * than the grammar: the output stays constrained (and ends "length" unfinished), never free - before,
     * the free draw stood and "x" came out. smp_sample still draws what smp_dist says. */
    {
        smp_params q = p;
        q.budget = 1;
        double w1[NV] = {0};
        int c1[NV] = {0}, n1 = 4000;
        if (smp_init(&s, &q, NV, &err) == 0) {
            size_t m = smp_dist(&s, lg);
            for (size_t i = 0; i < m; i++) w1[s.cand[i].id] += s.cand[i].p;
            smp_free(&s);
        }
        for (int i = 0; i < n1; i++) {
            q.seed = 7000 + (uint64_t)i;
            if (smp_init(&s, &q, NV, &err) != 0) break;
            c1[smp_sample(&s, lg)]++;
            smp_free(&s);
        }
        double worst = 0;
        for (int i = 0; i < NV; i++) {
            double sd = sqrt(n1 * w1[i] * (1 - w1[i])) + 1e-9, z = fabs(c1[i] - n1 * w1[i]) / sd;
            if (w1[i] == 0) z = c1[i] ? INFINITY : 0;
            worst = z > worst ? z : worst;
        }
        CHECK(w1[0] > 0 && w1[1] > 0 && w1[3] > 0 && fabs(w1[0] + w1[1] + w1[3] - 1) < 1e-5 && worst < 4.5,
              "a budget too small for any sentence keeps the grammar: a %.3f b %.3f ab %.3f, nothing else; "
              "draws follow (worst %.2f sigma)", w1[0], w1[1], w1[3], worst);
    }
    /* After "ab": speculative acceptance moved the grammar over what it committed. */
    p.seed = 5;
    p.temperature = 0;
    if (smp_init(&s, &p, NV, &err) == 0) {
        float rows[3 * NV];
        for (int r = 0; r < 3; r++) memcpy(rows + r * NV, lg, sizeof lg);
        rows[0 * NV + 0] = 9;  /* row 0 wants "a": the draft */
        rows[1 * NV + 1] = 9;  /* row 1 wants "b": the draft */
        int32_t blk[3] = {7, 0, 1}, out[3];
        int no = spec_accept(&s, rows, NV, blk, 2, NULL, out);
        /* greedy at row 2: "c" (2.0) is now allowed and beats "ca" (refused: nothing follows c) */
        CHECK(no == 3 && out[0] == 0 && out[1] == 1 && out[2] == 2 && gr_done(g, &s.gs),
              "greedy acceptance keeps a, b and takes c from the third row (the sentence is whole)");
        smp_free(&s);
    }
    /* smp_grammar_prefix: cut at the first refusal, after the end, or where the budget could not close */
    gr_state st, scratch = {0};
    if (gr_state_init(g, &st) == 0) {
        smp_params q = p;
        const int32_t b1[] = {0, 3, 1, 2, 6, 0}, b2[] = {0, 5, 1}, b3[] = {2}, b4[] = {0, 1, 0, 1};
        int c1 = smp_grammar_prefix(&q, &st, 0, b1, 6, &scratch), c2 = smp_grammar_prefix(&q, &st, 0, b2, 3, &scratch);
        int c3 = smp_grammar_prefix(&q, &st, 0, b3, 1, &scratch);
        q.budget = 4; /* a, b, a leave one token: c must come; a fourth "b" leaves none to close with */
        int c4 = smp_grammar_prefix(&q, &st, 0, b4, 4, &scratch);
        int c5 = smp_grammar_prefix(&q, &st, 1, b4, 4, &scratch); /* one already sampled: "a b" then c */
        CHECK(c1 == 5 && c2 == 1 && c3 == 0 && c4 == 3 && c5 == 2,
              "smp_grammar_prefix: a ab b c <end> | a; a | x; c first refused; budget 4 keeps a b a (%d %d %d %d %d)",
              c1, c2, c3, c4, c5);
        gr_state_free(&st);
        gr_state_free(&scratch);
    }
    gr_free(g);
}

/* The wire form: a decoded grammar recognizes what the original does (random sentences of each are whole
 * sentences of the other, and a sentence with a byte changed is judged alike), encoding the decoded one
 * again gives the same bytes, and every truncation and every single-byte corruption of the first 400 bytes
 * is refused with a message or decodes to a grammar that builds - never a crash (the ASan build runs this). */
static void test_grammar_wire(void) {
    rl_err err;
    cJSON *tools = cJSON_Parse("[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
                               "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"}},\"required\":[\"city\"]}}}]");
    gr_grammar *gs[3] = {js_object_grammar_new(&err),
                         schema_grammar("{\"type\":\"array\",\"items\":{\"anyOf\":[{\"type\":\"number\"},{\"enum\":[\"a\",null]}]},\"maxItems\":4}", &err),
                         chat_tools_grammar_new(CHAT_FMT_K3, tools, NULL, true, false, &err)};
    cJSON_Delete(tools);
    for (int k = 0; k < 3; k++) {
        if (!gs[k]) {
            CHECK(false, "grammar %d builds: %s", k, err.msg);
            continue;
        }
        uint8_t *w = NULL, *w2 = NULL;
        size_t n = 0, n2 = 0;
        gr_grammar *d = gr_encode(gs[k], &w, &n) == 0 ? gr_decode(w, n, &err) : NULL;
        CHECK(d != NULL, "grammar %d: its %zu-byte wire form decodes%s%s", k, n, d ? "" : ": ", d ? "" : err.msg);
        if (!d) {
            free(w);
            continue;
        }
        CHECK(gr_encode(d, &w2, &n2) == 0 && n2 == n && memcmp(w, w2, n) == 0, "grammar %d: encoding the decoded one gives the same bytes", k);
        uint64_t rng = 99 + (uint64_t)k;
        int same = 0;
        for (int i = 0; i < 60; i++) {
            char buf[2048];
            const gr_grammar *from = i % 2 ? d : gs[k], *to = i % 2 ? gs[k] : d;
            size_t m = gram_walk(from, &rng, i * 5, buf, sizeof buf);
            buf[m] = 0;
            bool ok = m > 0 && gram_feed(to, buf) == 1;
            if (m > 1) { /* one byte changed: both judge it the same way */
                buf[(rng >> 20) % m] ^= (char)(1 + (rng >> 40) % 255);
                ok = ok && gram_feed(to, buf) == gram_feed(from, buf);
            }
            same += ok;
        }
        CHECK(same == 60, "grammar %d: 60 random sentences (30 each way) whole in the other; altered ones judged alike (%d)", k, same);
        int bad = 0, crashed_not = 0;
        for (size_t t = 0; t < n; t++) {
            gr_grammar *x = gr_decode(w, t, &err);
            bad += x == NULL && err.msg[0] != 0;
            gr_free(x);
        }
        for (size_t i = 0; i < n && i < 400; i++) {
            for (int bit = 0; bit < 8; bit += 3) {
                w[i] ^= (uint8_t)(1u << bit);
                gr_grammar *x = gr_decode(w, n, &err);
                crashed_not += x != NULL || err.msg[0] != 0;
                gr_free(x);
                w[i] ^= (uint8_t)(1u << bit);
            }
        }
        CHECK(bad == (int)n, "grammar %d: all %zu truncations refused with a message (%d)", k, n, bad);
        CHECK(crashed_not == 3 * (int)(n < 400 ? n : 400), "grammar %d: corrupted bytes refused or decoded to a built grammar", k);
        free(w);
        free(w2);
        gr_free(d);
        gr_free(gs[k]);
    }
}

/* tool_choice auto: the reply may end without calls or call well-formed; strict tools get their schema
 * exactly (unenforceable keywords refused), the others a lenient one; lenient schemas ignore such keywords. */
static void test_tools_grammar_auto(void) {
    rl_err err;
    cJSON *tools = cJSON_Parse("[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\","
                               "\"properties\":{\"n\":{\"type\":\"integer\",\"minimum\":0}},\"required\":[\"n\"]}}}]");
    gr_grammar *g = chat_tools_grammar_new(CHAT_FMT_K3, tools, NULL, false, true, &err);
    CHECK(g != NULL, "auto, a non-strict tool with 'minimum': the grammar builds (lenient)%s%s", g ? "" : ": ", g ? "" : err.msg);
    int plain = 0, calls = 0, bad = 0;
    uint64_t rng = 3;
    for (int w = 0; g && w < 60; w++) {
        char raw[4096], text[8192];
        size_t n = gram_walk(g, &rng, w * 4, raw, sizeof raw);
        unsym(raw, n, text);
        const char *sec = strstr(text, "<|open|>tools<|sep|>");
        if (!sec) {
            size_t tl = strlen(text), el = strlen("<|close|>response<|sep|><|close|>message<|sep|>");
            bool ok = tl >= el && !strcmp(text + tl - el, "<|close|>response<|sep|><|close|>message<|sep|>");
            plain += ok, bad += !ok;
            continue;
        }
        chat_call cs[CHAT_MAX_CALLS];
        int nc = 0, rc = chat_tools_parse(sec + 20, strlen(sec + 20) - strlen("<|close|>message<|sep|>"), cs, &nc);
        bool ok = rc == 1 && nc >= 1;
        for (int c = 0; ok && c < nc; c++) {
            cJSON *a = cJSON_Parse(cs[c].arguments);
            ok = !strcmp(cs[c].name, "f") && cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(a, "n"));
            cJSON_Delete(a);
        }
        chat_calls_free(cs, nc);
        calls += ok, bad += !ok;
    }
    CHECK(g && bad == 0 && plain > 0 && calls > 0, "auto: 60 random replies end without calls (%d) or with valid calls (%d), none malformed",
          plain, calls);
    gr_free(g);
    cJSON_AddItemToObject(cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(tools, 0), "function"), "strict", cJSON_CreateTrue());
    g = chat_tools_grammar_new(CHAT_FMT_K3, tools, NULL, false, true, &err);
    CHECK(!g && strstr(err.msg, "minimum"), "a strict tool with 'minimum' is refused, naming it: %s", g ? "(built)" : err.msg);
    gr_free(g);
    cJSON_Delete(tools);
    cJSON *sc = cJSON_Parse("{\"type\":\"object\",\"properties\":{\"s\":{\"type\":\"string\",\"pattern\":\"^a\"}},\"required\":[\"s\"]}");
    gr_grammar *strict = js_grammar_new(sc, false, &err), *lenient = js_grammar_new(sc, true, &err);
    CHECK(!strict && lenient && gram_feed(lenient, "{\"s\": \"b\"}") == 1 && gram_feed(lenient, "{\"t\": 1}") == -1,
          "json_schema: 'pattern' refused when strict; lenient, ignored while the rest holds (s required)");
    gr_free(strict);
    gr_free(lenient);
    cJSON_Delete(sc);
}

/* utf8_len: the lengths of valid sequences, and for invalid ones 0 with the maximal subpart the WHATWG
 * decoder replaces by one U+FFFD (what Python's errors='replace' shows). */
static void test_utf8(void) {
    static const struct { const char *s; size_t n, len, bad; } cs[] = {
        {"a", 1, 1, 0},          {"\xC3\xA9", 2, 2, 0},    {"\xE2\x82\xAC", 3, 3, 0}, {"\xF0\x9F\x98\x80", 4, 4, 0},
        {"\xC3", 1, 0, 1},       /* cut off */             {"\xE2\x82", 2, 0, 2},     {"\xC0\xAF", 2, 0, 1}, /* overlong */
        {"\xE0\x80\x80", 3, 0, 1}, {"\xED\xA0\x80", 3, 0, 1}, /* surrogate */  {"\xF4\x90\x80\x80", 4, 0, 1},
        {"\xF0\x9F\x98", 3, 0, 3}, {"\xFF", 1, 0, 1},         {"\x80", 1, 0, 1},
    };
    int ok = 0, n = (int)(sizeof cs / sizeof cs[0]);
    for (int i = 0; i < n; i++) {
        size_t bad = 0, len = utf8_len((const unsigned char *)cs[i].s, cs[i].n, &bad);
        ok += len == cs[i].len && (len || bad == cs[i].bad) && utf8_len((const unsigned char *)cs[i].s, cs[i].n, NULL) == len;
    }
    CHECK(ok == n, "utf8_len: %d of %d sequences judged as the WHATWG decoder does (lengths, maximal subparts)", ok, n);
}

/* chat_gram_caps_get: what constrained output a model can honour - all of it on synth's K3 vocabulary; no
 * sections in a K2 format; nothing to end a grammar with when no token ends generation (the server answers
 * response_format with a 400 then), each lack named. */
static void test_gram_caps(const tok_tokenizer *t) {
    chat_gram_caps c;
    chat_gram_caps_get(t, CHAT_FMT_K3, &c);
    CHECK(c.sections && c.eog && !c.lacks[0], "caps: synth's K3 vocabulary honours tool calls and response_format");
    chat_gram_caps_get(t, CHAT_FMT_K2, &c);
    CHECK(!c.sections && c.eog && strstr(c.lacks, "section markers"), "caps: a K2 format has no sections: %s", c.lacks);
    tok_tokenizer no_end = *t; /* the same vocabulary, no token ending generation */
    uint8_t *zero = calloc((size_t)t->n_vocab, 1);
    if (!zero) return;
    no_end.eog = zero;
    chat_gram_caps_get(&no_end, CHAT_FMT_K3, &c);
    CHECK(c.sections && !c.eog && strstr(c.lacks, "an end-of-generation token"), "caps: no end-of-generation token is named: %s",
          c.lacks);
    free(zero);
}

int main(void) {
    rl_err err;
    sv_vocab v;
    if (sv_build(&v, 1024, &err)) {
        fprintf(stderr, "sv_build: %s\n", err.msg);
        return 1;
    }
    struct gguf_context *g = gguf_init_empty();
    tok_tokenizer t;
    if (sv_write_gguf(&v, g, &err) || tok_load_gguf(&t, g, &err)) {
        fprintf(stderr, "vocabulary: %s\n", err.msg);
        return 1;
    }
    gguf_free(g);
    sv_free(&v);
    test_tokenizer(&t);
    test_load_errors();
    test_stream(&t);
    test_chat(&t);
    test_sampler();
    test_sampler_bias();
    test_logprobs();
    test_chat_split(&t);
    test_json_object_grammar();
    test_tools_parse();
    test_tools_grammar();
    test_json_schema();
    test_grammar_sampling();
    test_grammar_wire();
    test_tools_grammar_auto();
    test_utf8();
    test_gram_caps(&t);
    tok_free(&t);
    return check_done();
}
