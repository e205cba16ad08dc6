/*
 * labelsel.h - a Kubernetes label selector (metav1.LabelSelector: matchLabels and
 * matchExpressions with In, NotIn, Exists, DoesNotExist) against an object's labels, as
 * the API server matches a webhook's namespaceSelector.  Pure.
 */
#ifndef GG_LABELSEL_H
#define GG_LABELSEL_H

#include <jansson.h>
#include <stdbool.h>

/*
 * Whether labels (an object of strings; NULL: none) match selector.  A NULL or empty selector
 * matches everything; an operator it does not know, or a malformed term, matches nothing.
 */
bool ls_matches(const json_t *selector, const json_t *labels);

#endif
