/* synth_vocab.h - a real, tiny Kimi-K3-shaped tokenizer for synthetic model files.
 *
 * `ringlm synth` writes small GGUF models that llama.cpp must load and tokenize exactly as it would a real K3
 * file. So the vocabulary is a genuine byte-level BPE (tokenizer.ggml.model "gpt2", pre "kimi-k2"): 256 byte
 * tokens, then merges learned from a corpus embedded in the binary (data/corpus, see corpus_blob.c), then
 * K3's 256-id special region at the top, laid out like ids 163584..163839 of the real vocabulary.
 *
 * Special region, relative to base = n_vocab - 256 (real K3: base = 163584). The names are K3's, not K2's:
 * K3 keeps K2's merges but renamed the chat markers (its chat format is <|open|>tag<|sep|> ...
 * <|close|>tag<|sep|> then <|end_of_msg|>; see llama.cpp models/templates/Kimi-K3.jinja).
 *   +0 [BOS]   +1 [EOS] (document end)   +2 <|end_of_msg|> (turn end; K3's configured eos)
 *   +3 <|open|>   +4 <|close|>   +5 <|sep|>   +6 [start_header_id]   +7 [end_header_id]   +9 [EOT]
 *   +18 <|media_begin|>  +19 <|media_content|>  +20 <|media_end|>  +21 <|media_pad|>  +65 <osagent_mode>
 *   +253 DSpark mask (a reserved slot in K3, 163837)   +254 [UNK]   +255 [PAD]
 *   every other slot: "<|reserved_token_<id>|>" with the token's own id, as Kimi's tokenizer names them.
 * All 256 are CONTROL, as llama.cpp's Kimi converter marks every tiktoken special token. */
#ifndef RINGLM_SYNTH_VOCAB_H
#define RINGLM_SYNTH_VOCAB_H

#include <stddef.h>
#include <stdint.h>

#include "../base/err.h"

struct gguf_context;

/* llama token types (llama.h's llama_token_type; the values are part of the GGUF format). */
enum { SV_TYPE_NORMAL = 1, SV_TYPE_CONTROL = 3, SV_TYPE_UNUSED = 5 };

/* Offsets inside the special region (id = base + offset). */
enum {
    SV_SPECIAL_N = 256,
    SV_OFF_BOS = 0,
    SV_OFF_EOS_DOC = 1,
    SV_OFF_END_OF_MSG = 2,
    SV_OFF_OPEN = 3,
    SV_OFF_CLOSE = 4,
    SV_OFF_SEP = 5,
    SV_OFF_EOT = 9,
    SV_OFF_MASK = 253,
    SV_OFF_UNK = 254,
    SV_OFF_PAD = 255,
};

typedef struct sv_vocab {
    int32_t n_tokens;
    char **tokens;          /* token text as llama.cpp stores it: GPT-2 byte-to-unicode mapped UTF-8 for normal tokens; special tokens verbatim */
    int32_t *types;         /* llama token types: 1 NORMAL, 3 CONTROL, 5 UNUSED */
    int32_t n_merges;
    char **merges;          /* "left right", mapped form, rank order; merge i made token 256 + i */
    int32_t bos_id, eos_id, pad_id, mask_id;   /* eos = <|end_of_msg|> (K3's turn end, 163586); mask = DSpark mask token */
    int32_t base;           /* first id of the special region, n_tokens - 256 */
    int32_t unk_id, eot_id; /* [UNK], [EOT] */
} sv_vocab;

/* One text of the training corpus. */
typedef struct sv_text {
    const char *name;
    const char *data;
    size_t len;
} sv_text;

/* The corpus embedded in the binary (corpus_blob.c): fills up to max entries of out and returns how many
 * texts there are (which may exceed max). */
#define SV_CORPUS_MAX 32
int sv_corpus(sv_text *out, int max);

/* Learns up to (n_vocab - 256 - 256) merges from the embedded corpus, deterministically; lays out ids:
 * [0,256) byte tokens (id = byte value), then merges' tokens in rank order, then "[PAD<i>]" UNUSED fillers if
 * the corpus ran out of pairs occurring >= 2 times, and the last 256 ids are K3's special region (above).
 * n_vocab must be >= 768. Takes well under a second on the shipped corpus. */
int sv_build(sv_vocab *v, int32_t n_vocab, rl_err *err);

/* The same, trained on the given texts instead (for tests). */
int sv_build_from(sv_vocab *v, int32_t n_vocab, const sv_text *texts, int n_texts, rl_err *err);

void sv_free(sv_vocab *v);

/* Writes tokenizer.ggml.model "gpt2", .pre "kimi-k2", .tokens, .token_type, .merges, bos/eos/unknown/padding
 * token ids, add_bos_token=false, and tokenizer.chat_template (our own Jinja template for K3's chat format,
 * sv_chat_template()). The DSpark mask id (tokenizer.ggml.mask_token_id) is NOT written: a real K3 target
 * file does not carry it; a draft-model writer adds it. */
int sv_write_gguf(const sv_vocab *v, struct gguf_context *g, rl_err *err);

/* Our Jinja chat template. For messages without tools it renders K3's framing:
 *   <|open|>message role="R"<|sep|>CONTENT<|close|>message<|sep|><|end_of_msg|>
 * and an assistant turn as <|open|>message role="assistant"<|sep|>[<|open|>think<|sep|>REASONING<|close|>think<|sep|>]
 * <|open|>response<|sep|>CONTENT<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>.
 * The generation prompt opens the assistant message and then the think section (thinking, the default) or the
 * response section (thinking=false; without `thinking`, llama.cpp's `enable_thinking` is used). Tool results
 * render as <|open|>message role="tool" tool="NAME" index="K"<|sep|>...; assistant tool calls as
 * <|open|>tools<|sep|><|open|>call tool="NAME" index="K"<|sep|><|open|>json type="object"<|sep|>ARGS
 * <|close|>json<|sep|><|close|>call<|sep|><|close|>tools<|sep|> after the response section. */
const char *sv_chat_template(void);

/* The pre-splitter used for training, an approximation of llama.cpp's kimi-k2 split: returns the end (byte
 * offset) of the piece that starts at pos, pos < len. Exposed for tests. */
size_t sv_pretok_next(const char *text, size_t len, size_t pos);

/* GPT-2 byte-to-unicode mapping: writes the UTF-8 form of byte b (1 or 2 bytes) to out, returns its length. */
int sv_byte_to_utf8(uint8_t b, char out[2]);

#endif
