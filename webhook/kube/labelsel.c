/*
 * labelsel.c - a label selector against labels (labelsel.h).
 */
#include "kube/labelsel.h"

#include <string.h>

static bool listed(const json_t *values, const char *value)
{
    size_t i;
    const json_t *v;
    json_array_foreach(values, i, v)
    {
        if (json_is_string(v) && strcmp(json_string_value(v), value) == 0)
            return true;
    }
    return false;
}

static bool term_matches(const json_t *expr, const json_t *labels)
{
    const char *key = json_string_value(json_object_get(expr, "key"));
    const char *op = json_string_value(json_object_get(expr, "operator"));
    const json_t *values = json_object_get(expr, "values");
    if (!key || !op)
        return false;
    const char *value = json_string_value(json_object_get(labels, key));
    if (strcmp(op, "Exists") == 0)
        return value != NULL;
    if (strcmp(op, "DoesNotExist") == 0)
        return value == NULL;
    if (!json_is_array(values))
        return false;
    if (strcmp(op, "In") == 0)
        return value && listed(values, value);
    if (strcmp(op, "NotIn") == 0)
        return !value || !listed(values, value);
    return false;
}

bool ls_matches(const json_t *selector, const json_t *labels)
{
    const char *key;
    const json_t *want;
    json_object_foreach((json_t *)json_object_get(selector, "matchLabels"), key, want)
    {
        const char *have = json_string_value(json_object_get(labels, key));
        if (!have || !json_is_string(want) || strcmp(have, json_string_value(want)) != 0)
            return false;
    }
    size_t i;
    const json_t *expr;
    json_array_foreach(json_object_get(selector, "matchExpressions"), i, expr)
    {
        if (!term_matches(expr, labels))
            return false;
    }
    return true;
}
