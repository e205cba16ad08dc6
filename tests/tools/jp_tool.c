/*
 * jp_tool.c - command-line front end to the jsonpatch module, for the Python
 * tests (tests/unit/test_jsonpatch_python.py) and for poking at patches:
 *
 *   jp_tool diff ORIGINAL.json EDITED.json   print the patch (jp_diff)
 *   jp_tool apply DOC.json PATCH.json        print DOC with PATCH applied
 *                                            (jp_apply_copy)
 *
 * Output is one line of compact JSON on stdout.  Exit 0 on success, 1 with the
 * message on stderr when a file cannot be read or the operation fails, 2 on a
 * usage error.  Uses only the module's public API.
 */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "util/gpuguard.h"
#include "codec/jsonpatch.h"

static void usage(void)
{
    fprintf(stderr, "usage: jp_tool diff ORIGINAL.json EDITED.json\n"
                    "       jp_tool apply DOC.json PATCH.json\n");
}

static json_t *load(const char *path)
{
    json_error_t jerr;
    json_t *v = json_load_file(path, JSON_DECODE_ANY, &jerr);

    if (!v)
        fprintf(stderr, "jp_tool: %s:%d:%d: %s\n", path, jerr.line, jerr.column, jerr.text);
    return v;
}

static int print(const json_t *v)
{
    if (json_dumpf(v, stdout, JSON_COMPACT | JSON_ENCODE_ANY) || fputc('\n', stdout) == EOF ||
        fflush(stdout)) {
        fprintf(stderr, "jp_tool: cannot write the result\n");
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    struct gg_err err = {{0}};
    json_t *a = NULL, *b = NULL, *out = NULL;
    enum gg_status st;
    int rc = 1;

    if (argc != 4 || (strcmp(argv[1], "diff") != 0 && strcmp(argv[1], "apply") != 0)) {
        usage();
        return 2;
    }
    a = load(argv[2]);
    b = a ? load(argv[3]) : NULL;
    if (!b)
        goto done;
    if (strcmp(argv[1], "diff") == 0)
        st = jp_diff(a, b, &out, &err);
    else
        st = jp_apply_copy(a, b, &out, &err);
    if (st != GG_OK) {
        fprintf(stderr, "jp_tool: %s: %s\n", gg_strerror(st), err.msg);
        goto done;
    }
    rc = print(out);
done:
    json_decref(out);
    json_decref(b);
    json_decref(a);
    return rc;
}
