/* chat_gram.h - the grammar of a Kimi K3 reply that must or may call tools (tool_choice "required", one
 * named tool, or "auto"), for constrained decoding (grammar.h).
 *
 * The reply the template's generation prompt opened: [the think section's rest, <|close|>think<|sep|>]
 * <|open|>response<|sep|>TEXT<|close|>response<|sep|> then a tools section of 1 to 8 calls, as the
 * template writes them (chat.h), and <|close|>message<|sep|>. Each call names a declared tool (or the named
 * one) and carries its arguments: for CHAT_FMT_K3 one <|open|>argument ...> tag per property in declared
 * order (the required ones always), a string property's value raw, the others JSON matching the property's
 * schema; for K3_LITE one JSON block matching the tool's parameters. The control tokens are the grammar's
 * symbols GR_SYM(0) <|open|>, GR_SYM(1) <|sep|>, GR_SYM(2) <|close|> (tok_vocab_new maps them); free text
 * is any other bytes but NUL. */
#ifndef RINGLM_CHAT_GRAM_H
#define RINGLM_CHAT_GRAM_H

#include <stdbool.h>

#include "../base/err.h"
#include "chat.h"
#include "grammar.h"
#include "sampler.h"
#include "tokenizer.h"

struct cJSON;

#define CHAT_SYM_OPEN GR_SYM(0)
#define CHAT_SYM_SEP GR_SYM(1)
#define CHAT_SYM_CLOSE GR_SYM(2)
#define CHAT_GRAM_MAX_CALLS 8

/* tools: OpenAI's tools array (validated by the caller: each {"type":"function","function":{"name":...}});
 * only: the one tool to call, or NULL for any; thinking: the generation prompt opened the think section;
 * optional: the reply may also end without a tools section (tool_choice "auto": the text is free, the
 * calls, when the model writes them, well formed). A tool whose function says "strict": true gets its
 * parameters' schema exactly (a keyword json_schema.h cannot enforce fails, named); the others a lenient
 * grammar (such keywords ignored). Fails for formats other than K3 / K3_LITE or an unknown `only`. */
gr_grammar *chat_tools_grammar_new(chat_format fmt, const struct cJSON *tools, const char *only, bool thinking,
                                   bool optional, rl_err *err);

/* Structured output (response_format json_schema / json_object) in a K3 reply: with thinking, the
 * reasoning is free text that the model closes itself, and the JSON is the response section's body, so it
 * reaches the content, never the reasoning (as llama-server applies a schema to the answer after the
 * reasoning). The JSON may end the reply at once or be followed by the closers the template writes.
 * schema: the JSON schema (cJSON true: any value), or NULL for any object. Fails as js_rule_add does, or
 * for formats other than K3 / K3_LITE (whose replies have no sections: use js_grammar_new). */
gr_grammar *chat_json_grammar_new(chat_format fmt, const struct cJSON *schema, bool lenient, bool thinking,
                                  rl_err *err);

/* What constrained output a model can honour, decided once at start from its chat format and vocabulary:
 * K3's section markers <|open|> <|sep|> <|close|> as tokens, which tool-call grammars and a structured
 * answer after the reasoning need (a kimi-k3 file without a chat template is given the K3 format, but its
 * vocabulary may lack them), and an end-of-generation token, without which no constrained output can
 * end. lacks: what is missing, for messages ("" when nothing). */
typedef struct chat_gram_caps {
    bool sections; /* a K3 format whose markers are all tokens: tool calls can be constrained */
    bool eog;      /* an end-of-generation token: response_format can be honoured */
    char lacks[160];
} chat_gram_caps;
void chat_gram_caps_get(const tok_tokenizer *t, chat_format fmt, chat_gram_caps *c);

/* The vocabulary constrained sampling follows (tok_vocab_new) with these grammars' symbols mapped: what the
 * server, a ring's last stage and its auditor all build from the model file, so they judge tokens alike.
 * NULL out of memory; free with tok_vocab_free. */
smp_vocab *chat_gram_vocab_new(const tok_tokenizer *t);

#endif
