/* json_schema.h - JSON schemas compiled into byte grammars (grammar.h), for structured output.
 *
 * The subset clients send (OpenAI structured outputs, pydantic, zod): type (one or a list), properties,
 * required, additionalProperties (false, true or a schema), items, minItems / maxItems, enum, const,
 * anyOf / oneOf, allOf with one member, local $ref (#/$defs/..., #/definitions/..., recursive ones
 * too), minLength / maxLength, and the string formats date, time, date-time and uuid. Annotations
 * (title, description, default, examples, $schema, $id, $comment, and other formats) are ignored. A
 * keyword that asserts something the grammar cannot enforce (pattern, minimum, uniqueItems, not, ...) is
 * refused by name rather than silently not enforced - unless the caller asks for a lenient grammar (a
 * schema not marked strict, as OpenAI's API has it): then such keywords are ignored and the grammar
 * allows a superset of what the schema does.
 *
 * Like llama.cpp's json-schema-to-grammar, an object's declared properties come in their declared order
 * (the required ones always, the others when the model writes them), additional ones after them. Blank
 * space: at most one run after each token (a space, or a newline and up to 4 spaces of indentation), so a
 * model cannot stall in whitespace. Numbers have at most 15 integer digits (exact in a double), 16
 * fraction digits and 3 exponent digits. The value's text is followed by nothing else. */
#ifndef RINGLM_JSON_SCHEMA_H
#define RINGLM_JSON_SCHEMA_H

#include <stdbool.h>

#include "../base/err.h"
#include "grammar.h"

struct cJSON;

/* The grammar of the JSON texts that match schema (true, or an empty object: any JSON value). */
gr_grammar *js_grammar_new(const struct cJSON *schema, bool lenient, rl_err *err);
/* Adds to b a rule for the JSON texts that match schema (its $refs resolved within schema itself) and
 * returns it, or -1 with err set. For grammars that hold JSON inside other text (tool-call arguments). */
int js_rule_add(gr_builder *b, const struct cJSON *schema, bool lenient, rl_err *err);
/* The grammar of any JSON object (response_format json_object). */
gr_grammar *js_object_grammar_new(rl_err *err);

#endif
