/*
 * fuzz_manifest.c - libFuzzer target for the manifest module (manifest.c,
 * manifest_emit.c, manifest_lines.c) over what yamldoc makes of the input.
 *
 * The input is a manifest stream.  Every entry mf_collect finds must be
 * consistent: a template's pointer names an object in its document and its
 * Pod is a Pod; a fixed patch on the Pod (labels, a container field, the
 * spec) mapped back with mf_map_patch must apply to the document; only the
 * whole spec of a KServe component (assembled from its fields) is dropped.  The
 * stream written back with mf_emit_yaml must read back as the same
 * documents (numbers by value).  mf_node_lines and mf_cluster_state run on
 * the same text.  A broken invariant aborts.
 */
#include "codec/jsonpatch.h"
#include "codec/manifest.h"
#include "codec/yamldoc.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_manifest: %s\n", what);
        abort();
    }
}

static void check_template(const struct yd_stream *s, const struct mf_entry *e, const json_t *lines)
{
    const json_t *doc = json_array_get(s->docs, e->doc);
    json_t *tpl = NULL;
    check(jp_pointer_get(doc, e->template_ptr, &tpl, NULL) == GG_OK && json_is_object(tpl),
          "a template pointer that names no object");
    check(json_is_object(e->pod) && json_is_object(json_object_get(e->pod, "spec")),
          "a template's Pod has no spec");
    const char *kind = json_string_value(json_object_get(e->pod, "kind"));
    check(kind && strcmp(kind, "Pod") == 0, "a template's Pod is not a Pod");
    if (lines)
        (void)mf_line_of(json_array_get(lines, e->doc_number - 1), e->template_ptr);

    char *mapped_ptr = NULL;
    enum gg_status ms = mf_map_pointer(e, "/spec/containers", &mapped_ptr);
    if (e->container_ptr) {
        check(ms == GG_ERR_INVALID, "a KServe model's container list maps");
    } else {
        check(ms == GG_OK, "/spec/containers does not map");
        check(strncmp(mapped_ptr, e->template_ptr, strlen(e->template_ptr)) == 0,
              "a mapped pointer is not under the template");
        free(mapped_ptr);
    }

    json_t *patch = json_pack("[{s:s,s:s,s:{s:s}},{s:s,s:s,s:O}]", "op", "add", "path",
                              "/metadata/labels", "value", "fuzz", "yes", "op", "replace", "path",
                              "/spec", "value", json_object_get(e->pod, "spec"));
    json_t *mapped = NULL, *dropped = NULL, *out = NULL;
    struct gg_err err = {{0}};
    check(mf_map_patch(e, doc, patch, &mapped, &dropped, &err) == GG_OK, "mf_map_patch failed");
    size_t want_dropped = e->assembled ? 1 : 0;
    check(json_array_size(dropped) == want_dropped, "mf_map_patch dropped a template op");
    if (jp_apply_copy(doc, mapped, &out, &err) != GG_OK) {
        fprintf(stderr, "fuzz_manifest: %s\n", err.msg);
        check(0, "a mapped patch does not apply to its document");
    }
    json_decref(out);
    json_decref(mapped);
    json_decref(dropped);
    json_decref(patch);
}

static void check_emit(const struct yd_stream *s)
{
    char *text = NULL;
    size_t len = 0;
    struct gg_err err = {{0}};
    if (mf_emit_yaml(s->docs, &text, &len, &err) != GG_OK) {
        fprintf(stderr, "fuzz_manifest: %s\n", err.msg);
        check(0, "mf_emit_yaml failed on what yamldoc read");
    }
    struct yd_limits lim;
    mf_yd_limits(&lim);
    json_t *back = NULL;
    if (yd_load_all(text, len, "emitted", &lim, &back, &err) != GG_OK) {
        fprintf(stderr, "fuzz_manifest: %s\n%s\n", err.msg, text);
        check(0, "the emitted YAML does not read back");
    }
    check(json_array_size(back) == json_array_size(s->docs), "emitted YAML has other documents");
    for (size_t i = 0; i < json_array_size(back); i++)
        check(jp_equal(json_array_get(back, i), json_array_get(s->docs, i)),
              "emitted YAML reads back as another document");
    json_decref(back);
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    struct yd_limits lim;
    mf_yd_limits(&lim);
    lim.max_bytes = 64 * 1024;
    lim.max_nodes = 20000;
    lim.max_alias_nodes = 2000;
    struct yd_stream s;
    struct gg_err err = {{0}};
    json_t *state = NULL;
    size_t counts[MF_STATE_N];
    if (mf_cluster_state(text, size, "fuzz.json", &state, counts, &err) == GG_OK)
        check(json_is_array(json_object_get(state, "items")), "a cluster state without items");
    json_decref(state);
    if (yd_load_stream(text, size, "fuzz.yaml", &lim, &s, &err) != GG_OK)
        return 0;
    json_t *lines = NULL;
    if (mf_node_lines(text, size, 1000, &lines, NULL) != GG_OK)
        lines = NULL;
    struct mf_set set;
    if (mf_collect(&s, "fuzz.yaml", &set, &err) == GG_OK) {
        check(set.count >= s.count && set.templates + set.skipped == set.count,
              "entry counts disagree");
        for (size_t i = 0; i < set.count; i++) {
            const struct mf_entry *e = &set.entries[i];
            check(e->doc < s.count, "an entry outside the stream");
            if (e->type == MF_TEMPLATE)
                check_template(&s, e, lines);
            else
                check(e->reason && *e->reason, "a skipped entry without a reason");
        }
        mf_set_clear(&set);
    }
    check_emit(&s);
    json_decref(lines);
    yd_stream_clear(&s);
    return 0;
}
