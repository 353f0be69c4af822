/* chat_out.c - following a K3 reply's framing (chat_out.h). */
#include "chat_out.h"

#include <string.h>

enum { CS_BODY, CS_NAME, CS_CLOSE_NAME, CS_BETWEEN };

void chat_split_init(chat_split *s, const tok_tokenizer *t, bool on, chat_format fmt, bool thinking) {
    memset(s, 0, sizeof *s);
    s->open = s->sep = s->close = -1;
    s->state = CS_BODY;
    s->chan = CHAT_CH_CONTENT;
    if (!on || (fmt != CHAT_FMT_K3 && fmt != CHAT_FMT_K3_LITE)) return;
    int32_t o = tok_find(t, "<|open|>", 8), p = tok_find(t, "<|sep|>", 7), c = tok_find(t, "<|close|>", 9);
    if (o < 0 || p < 0 || c < 0) return;
    s->open = o, s->sep = p, s->close = c;
    s->chan = thinking ? CHAT_CH_REASONING : CHAT_CH_CONTENT;
}

chat_chan chat_split_push(chat_split *s, const tok_tokenizer *t, int32_t id) {
    if (s->open < 0) return CHAT_CH_CONTENT;
    if (id == s->open || id == s->close) {
        s->state = id == s->open ? CS_NAME : CS_CLOSE_NAME;
        s->name_len = 0;
        return CHAT_CH_NONE;
    }
    if (id == s->sep && (s->state == CS_NAME || s->state == CS_CLOSE_NAME)) {
        if (s->state == CS_CLOSE_NAME) {
            s->state = CS_BETWEEN;
        } else {
            s->state = CS_BODY;
            bool think = s->name_len == 5 && memcmp(s->name, "think", 5) == 0;
            s->chan = think ? CHAT_CH_REASONING : CHAT_CH_CONTENT;
        }
        return CHAT_CH_NONE;
    }
    if (s->state == CS_NAME || s->state == CS_CLOSE_NAME) {
        const char *p;
        size_t n;
        if (tok_piece(t, id, false, &p, &n) == 0) {
            for (size_t i = 0; i < n && s->name_len < sizeof s->name; i++) s->name[s->name_len++] = p[i];
        }
        return CHAT_CH_NONE;
    }
    return s->state == CS_BODY ? s->chan : CHAT_CH_CONTENT;
}
