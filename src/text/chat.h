/* chat.h - Kimi chat prompts: the text llama.cpp's Jinja engine renders from a Kimi chat template.
 *
 * ringlm has no Jinja engine. Instead the model's tokenizer.chat_template is recognised and the matching
 * formatter below reproduces what that template renders (checked against llama.cpp's own renderer):
 *
 *   CHAT_FMT_K3       llama.cpp's models/templates/Kimi-K3.jinja (XTML framing, what real K3 GGUFs carry):
 *                     [thinking-effort system message] then per message
 *                     <|open|>message role="R"[ name="N"]<|sep|>CONTENT<|close|>message<|sep|><|end_of_msg|>;
 *                     an assistant body is [<|open|>think<|sep|>REASONING<|close|>think<|sep|>]
 *                     <|open|>response<|sep|>CONTENT<|close|>response<|sep|>[<|open|>tools<|sep|>...];
 *                     tool results are <|open|>message role="tool" tool="NAME" index="I"<|sep|>...
 *   CHAT_FMT_K3_LITE  the smaller K3 template `ringlm synth` writes (src/tools/synth_vocab.c): the same framing
 *                     without the thinking-effort message, names, attribute escaping or argument tags
 *   CHAT_FMT_K2       Kimi-K2-Instruct: <|im_user|>user<|im_middle|>CONTENT<|im_end|> ...
 *   CHAT_FMT_K2_THINKING  Kimi-K2-Thinking: the same plus <think>...</think> in assistant turns
 *
 * Detection (chat_detect): <|open|>, <|close|> and <|end_of_msg|> make a K3 template (as llama.cpp detects it),
 * full if it mentions thinking_effort; <|im_middle|> makes a K2 one, thinking if it has <think>. Anything else
 * is refused. A model without a template gets CHAT_FMT_K3: llama.cpp's converter embeds Kimi-K3.jinja then.
 *
 * The result is text with the markers spelled out; tokenize it with parse_special = true. Tool calls carry
 * their arguments as JSON text (OpenAI style; text that is not JSON is refused, as llama.cpp refuses it,
 * and NULL means {}); like llama.cpp, K3 parses them (an object becomes one
 * <|open|>argument key=... type=...> tag per key) and K3_LITE / K2 re-serialize them as the template's tojson
 * would (", " and ": " separators, non-ASCII kept, floats printed like printf %g). Tool declarations
 * (chat_opts.tools) come first, as llama.cpp passes them to the template. Not rendered, as llama.cpp does
 * not pass them either: tool_choice, response_format; images (the API has no place for them). */
#ifndef RINGLM_CHAT_H
#define RINGLM_CHAT_H

#include <stdbool.h>
#include <stddef.h>

#include "../base/err.h"

struct mf_model;

typedef enum chat_format { CHAT_FMT_K3, CHAT_FMT_K3_LITE, CHAT_FMT_K2, CHAT_FMT_K2_THINKING } chat_format;

typedef enum chat_role { CHAT_SYSTEM, CHAT_USER, CHAT_ASSISTANT, CHAT_TOOL } chat_role;

typedef struct chat_tool_call {
    const char *id;        /* optional; tool results name it in tool_call_id */
    const char *name;      /* the function's name (required) */
    const char *arguments; /* JSON text, normally an object; NULL = none */
} chat_tool_call;

typedef struct chat_msg {
    chat_role role;
    const char *content;      /* NULL = no content */
    const char *reasoning;    /* assistant: reasoning_content (shown when thinking); NULL = none */
    const char *name;         /* user/system/assistant: optional speaker name; tool: the tool's name */
    const char *tool_call_id; /* tool: the call this result answers (optional) */
    const chat_tool_call *tool_calls; /* assistant */
    int n_tool_calls;
} chat_msg;

typedef struct chat_opts {
    bool add_generation_prompt; /* end with the opener of an assistant turn, for generation */
    bool thinking;              /* the templates' `thinking` variable (K3, K3_LITE); their default is true */
    const char *thinking_effort; /* K3: "low", "high" or "max"; NULL = the template's default "max";
                                  * "none" = no thinking-effort message */
    const char *tools;          /* the tools the model may call: OpenAI's `tools` array as JSON text, declared
                                 * in a system message first (K3: its keys sorted, as the template's
                                 * json_sorted; others: tojson); NULL or [] = none */
} chat_opts;

/* Defaults as the templates have them: generation prompt on, thinking on, effort "max". */
chat_opts chat_opts_default(void);

/* Recognises a chat template (NULL = the model has none). */
int chat_detect(const char *tmpl, chat_format *fmt, rl_err *err);
/* The same for a model's tokenizer.chat_template. */
int chat_detect_model(const struct mf_model *m, chat_format *fmt, rl_err *err);
const char *chat_format_name(chat_format fmt);

/* Renders the conversation. *out is allocated and NUL-terminated (free() it). Errors where the template
 * raises (a tool call without a name, a K3 tool result whose tool cannot be resolved, K3 arguments that
 * are JSON but not an object, an unsupported thinking_effort). */
int chat_render(chat_format fmt, const chat_msg *msgs, int n_msgs, const chat_opts *o, char **out, size_t *out_len,
                rl_err *err);

#endif
