/* corpus_blob.c - the tokenizer training corpus (the .txt files in data/corpus), embedded in the binary.
 *
 * ringlm runs from anywhere, so `synth` cannot read data/corpus at run time. The assembler copies each file
 * into .rodata with .incbin. Its paths are relative to the compiler's working directory, which is the repo
 * root for every build (the Makefile compiles from there). make cannot see these inputs through -MMD, so the
 * Makefile lists them as extra prerequisites of this object. Each blob gets a NUL after it (not counted in
 * its length) so that a stray string function can never run off the end. */
#include "synth_vocab.h"

#define SV_INCBIN(sym, path)                                                                                   \
    __asm__(".pushsection .rodata\n"                                                                           \
            ".balign 16\n"                                                                                     \
            ".local " #sym "_start\n"                                                                          \
            #sym "_start:\n"                                                                                   \
            ".incbin \"" path "\"\n"                                                                           \
            ".local " #sym "_end\n"                                                                            \
            #sym "_end:\n"                                                                                     \
            ".byte 0\n"                                                                                        \
            ".popsection\n");                                                                                  \
    extern const char sym##_start[], sym##_end[]

SV_INCBIN(sv_corpus_en_prose, "data/corpus/en_prose.txt");
SV_INCBIN(sv_corpus_zh_prose, "data/corpus/zh_prose.txt");
SV_INCBIN(sv_corpus_ja_ko_prose, "data/corpus/ja_ko_prose.txt");
SV_INCBIN(sv_corpus_code_c, "data/corpus/code_c.txt");
SV_INCBIN(sv_corpus_code_py, "data/corpus/code_py.txt");
SV_INCBIN(sv_corpus_misc_mixed, "data/corpus/misc_mixed.txt");
SV_INCBIN(sv_corpus_gen_en_notes, "data/corpus/gen_en_notes.txt");
SV_INCBIN(sv_corpus_gen_zh_notes, "data/corpus/gen_zh_notes.txt");
SV_INCBIN(sv_corpus_gen_data, "data/corpus/gen_data.txt");
SV_INCBIN(sv_corpus_gen_code, "data/corpus/gen_code.txt");

int sv_corpus(sv_text *out, int max) {
    /* end - start of two assembler labels is not a C constant expression, so the lengths are computed here
     * into the caller's array rather than kept in a static table */
#define SV_ENTRY(sym, file) {file, sym##_start, sym##_end}
    static const struct {
        const char *name;
        const char *start, *end;
    } files[] = {
        SV_ENTRY(sv_corpus_en_prose, "en_prose.txt"),
        SV_ENTRY(sv_corpus_zh_prose, "zh_prose.txt"),
        SV_ENTRY(sv_corpus_ja_ko_prose, "ja_ko_prose.txt"),
        SV_ENTRY(sv_corpus_code_c, "code_c.txt"),
        SV_ENTRY(sv_corpus_code_py, "code_py.txt"),
        SV_ENTRY(sv_corpus_misc_mixed, "misc_mixed.txt"),
        SV_ENTRY(sv_corpus_gen_en_notes, "gen_en_notes.txt"),
        SV_ENTRY(sv_corpus_gen_zh_notes, "gen_zh_notes.txt"),
        SV_ENTRY(sv_corpus_gen_data, "gen_data.txt"),
        SV_ENTRY(sv_corpus_gen_code, "gen_code.txt"),
    };
#undef SV_ENTRY
    const int n = (int)(sizeof files / sizeof files[0]);
    for (int i = 0; i < n && i < max; i++) {
        out[i].name = files[i].name;
        out[i].data = files[i].start;
        out[i].len = (size_t)(files[i].end - files[i].start);
    }
    return n;
}
