/* chat_out.h - a K3 reply split into its channels as it is generated.
 *
 * A K3 assistant turn (chat.h, CHAT_FMT_K3 / K3_LITE) is framed by control tokens:
 *   <|open|>think<|sep|>REASONING<|close|>think<|sep|><|open|>response<|sep|>CONTENT<|close|>response<|sep|>
 * and the generation prompt already opened the first section (think when thinking is on, else response).
 * The framing renders as nothing, but the section names between <|open|> / <|close|> and <|sep|> are plain
 * text: left in, a reply would read "REASONINGthinkresponseCONTENTresponse". chat_split follows the framing
 * token by token and says where each token's text goes: the reasoning (reasoning_content), the content,
 * the tool calls, or nowhere (a section name). Text outside any section, and a section it does not know,
 * counts as content, so nothing the model writes is lost. Formats other than K3
 * (K2's <think> text tags) put everything in the content. */
#ifndef RINGLM_CHAT_OUT_H
#define RINGLM_CHAT_OUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "chat.h"
#include "tokenizer.h"

/* CHAT_CH_TOOLS: the tool-call section's body and its closer <|close|>tools<|sep|>, framing included (the
 * caller keeps its raw text, control tokens spelled out, for chat_tools_parse). */
typedef enum chat_chan { CHAT_CH_NONE, CHAT_CH_CONTENT, CHAT_CH_REASONING, CHAT_CH_TOOLS } chat_chan;

typedef struct chat_split {
    int32_t open, sep, close; /* the framing tokens; -1 when not split (then everything is content) */
    int state;                /* inside a section's body, reading a section's name, or between sections */
    chat_chan chan;           /* the body's channel */
    char name[16];            /* the name being read (longer names are cut: they are no section we know) */
    size_t name_len;
    bool tools;               /* inside the tools section */
} chat_split;

/* on: split at all (false: everything is content); thinking: the generation prompt opened the think
 * section (chat_opts.thinking). */
void chat_split_init(chat_split *s, const tok_tokenizer *t, bool on, chat_format fmt, bool thinking);
/* The channel token id's text belongs to. */
chat_chan chat_split_push(chat_split *s, const tok_tokenizer *t, int32_t id);

/* ---- tool calls -------------------------------------------------------------------------------------- */

/* One call parsed from a tools section: the tool's name and its arguments as a JSON object's text. */
typedef struct chat_call {
    char *name;
    char *arguments;
} chat_call;

#define CHAT_MAX_CALLS 16

/* Parses the raw text of a K3 tools section (CHAT_CH_TOOLS, control tokens spelled out), as far as it
 * goes: per call <|open|>call tool="NAME" index="I"<|sep|> with its arguments,
 * one <|open|>argument key="K" type="T"<|sep|>VALUE<|close|>argument<|sep|> per key (VALUE raw for
 * type="string", JSON otherwise) or one <|open|>json type="object"<|sep|>{...}<|close|>json<|sep|> block,
 * then <|close|>call<|sep|>, and finally <|close|>tools<|sep|>. The complete calls go to calls (free them
 * with chat_calls_free), *n of them. Returns 1 when the section is closed, 0 when what is there is a
 * prefix of a valid one (more may come), -1 when it is malformed (a call whose arguments are not JSON, an
 * unknown tag, more than CHAT_MAX_CALLS calls). */
int chat_tools_parse(const char *text, size_t len, chat_call *calls, int *n);
void chat_calls_free(chat_call *calls, int n);

#endif
