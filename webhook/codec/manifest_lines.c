/*
 * manifest_lines.c - the line of each node of a YAML stream, by JSON
 * pointer, for messages about content that parsed (mf_node_lines and
 * mf_line_of in manifest.h).
 *
 * Pure: libc, libyaml and jansson only; no I/O, no globals.
 */
#include "codec/manifest.h"

#include "codec/jsonpatch.h"

#include <stdlib.h>
#include <string.h>
#include <yaml.h>

struct line_frame {
    char *ptr;
    bool is_map;
    bool want_key;
    size_t index;
    char *key; /* escaped pending key */
};

struct line_walk {
    struct line_frame *stack;
    size_t depth, cap;
    size_t deep; /* levels below MF_MAX_DEPTH that are not recorded */
    json_t *doc; /* pointer -> line of the current document */
    size_t recorded, max_nodes;
};

static void line_record(struct line_walk *w, const char *ptr, size_t line)
{
    if (w->recorded >= w->max_nodes || json_object_get(w->doc, ptr))
        return;
    json_object_set_new(w->doc, ptr, json_integer((json_int_t)line));
    w->recorded++;
}

/* The pointer of the node that starts now (NULL when not tracked), malloc'ed. */
static char *line_node_ptr(struct line_walk *w, bool *is_key)
{
    *is_key = false;
    if (w->deep)
        return NULL;
    if (w->depth == 0)
        return strdup("");
    struct line_frame *f = &w->stack[w->depth - 1];
    char *out = NULL;
    if (f->is_map && f->want_key) {
        *is_key = true;
        return NULL;
    }
    if (f->is_map) {
        if (asprintf(&out, "%s/%s", f->ptr, f->key ? f->key : "") < 0)
            out = NULL;
        f->want_key = true;
    } else if (asprintf(&out, "%s/%zu", f->ptr, f->index++) < 0) {
        out = NULL;
    }
    return out;
}

static void line_walk_clear(struct line_walk *w)
{
    for (size_t i = 0; i < w->depth; i++) {
        free(w->stack[i].ptr);
        free(w->stack[i].key);
    }
    free(w->stack);
}

static enum gg_status line_event(struct line_walk *w, const yaml_event_t *ev)
{
    size_t line = ev->start_mark.line + 1;
    bool is_key;
    char *ptr;
    switch (ev->type) {
    case YAML_SCALAR_EVENT:
    case YAML_ALIAS_EVENT:
        ptr = line_node_ptr(w, &is_key);
        if (is_key) {
            struct line_frame *f = &w->stack[w->depth - 1];
            free(f->key);
            f->key = NULL;
            f->want_key = false;
            if (ev->type == YAML_SCALAR_EVENT) {
                const char *k = (const char *)ev->data.scalar.value;
                size_t n = ev->data.scalar.length, elen = jp_escape(k, n, NULL, 0);
                f->key = malloc(elen + 1);
                if (!f->key)
                    return GG_ERR_NOMEM;
                jp_escape(k, n, f->key, elen + 1);
                char *kp = NULL;
                if (asprintf(&kp, "%s/%s", f->ptr, f->key) < 0)
                    return GG_ERR_NOMEM;
                line_record(w, kp, line);
                free(kp);
            }
            return GG_OK;
        }
        if (ptr)
            line_record(w, ptr, line);
        free(ptr);
        return GG_OK;
    case YAML_SEQUENCE_START_EVENT:
    case YAML_MAPPING_START_EVENT:
        ptr = line_node_ptr(w, &is_key);
        if (is_key) { /* a collection used as a key: not tracked below */
            w->stack[w->depth - 1].want_key = false;
            free(w->stack[w->depth - 1].key);
            w->stack[w->depth - 1].key = NULL;
            w->deep++;
            return GG_OK;
        }
        if (!ptr || w->depth >= MF_MAX_DEPTH) {
            free(ptr);
            w->deep++;
            return GG_OK;
        }
        line_record(w, ptr, line);
        if (w->depth == w->cap) {
            size_t cap = w->cap ? w->cap * 2 : 16;
            struct line_frame *grown = realloc(w->stack, cap * sizeof(*grown));
            if (!grown) {
                free(ptr);
                return GG_ERR_NOMEM;
            }
            w->stack = grown;
            w->cap = cap;
        }
        w->stack[w->depth++] = (struct line_frame){
            .ptr = ptr, .is_map = ev->type == YAML_MAPPING_START_EVENT, .want_key = true};
        return GG_OK;
    case YAML_SEQUENCE_END_EVENT:
    case YAML_MAPPING_END_EVENT:
        if (w->deep) {
            w->deep--;
        } else if (w->depth) {
            w->depth--;
            free(w->stack[w->depth].ptr);
            free(w->stack[w->depth].key);
        }
        return GG_OK;
    default:
        return GG_OK;
    }
}

enum gg_status mf_node_lines(const char *text, size_t len, size_t max_nodes, json_t **out,
                             struct gg_err *err)
{
    yaml_parser_t parser;
    yaml_event_t ev;
    struct line_walk w = {.max_nodes = max_nodes};
    json_t *docs = json_array();
    enum gg_status st = GG_OK;
    if (!docs || !yaml_parser_initialize(&parser)) {
        json_decref(docs);
        return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    for (;;) {
        if (!yaml_parser_parse(&parser, &ev)) {
            st = gg_fail(err, GG_ERR_PARSE, "%zu:%zu: %s", parser.problem_mark.line + 1,
                         parser.problem_mark.column + 1,
                         parser.problem ? parser.problem : "cannot read YAML");
            break;
        }
        yaml_event_type_t type = ev.type;
        if (type == YAML_DOCUMENT_START_EVENT) {
            w.doc = json_object();
            json_array_append_new(docs, w.doc);
            w.deep = 0;
        } else if (w.doc) {
            st = line_event(&w, &ev);
        }
        yaml_event_delete(&ev);
        if (st != GG_OK) {
            gg_fail(err, st, "out of memory");
            break;
        }
        if (type == YAML_STREAM_END_EVENT)
            break;
    }
    yaml_parser_delete(&parser);
    line_walk_clear(&w);
    if (st != GG_OK) {
        json_decref(docs);
        return st;
    }
    *out = docs;
    return GG_OK;
}

size_t mf_line_of(const json_t *lines, const char *pointer)
{
    size_t n = strlen(pointer);
    char *p = strndup(pointer, n);
    size_t line = 0;
    if (!p)
        return 0;
    for (;;) {
        json_t *v = json_object_get(lines, p);
        if (v) {
            line = (size_t)json_integer_value(v);
            break;
        }
        char *slash = strrchr(p, '/');
        if (!slash)
            break;
        *slash = '\0';
    }
    free(p);
    return line;
}
