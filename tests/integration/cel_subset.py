"""The part of CEL that deploy/'s matchConditions use, evaluated over JSON-like Python values.

Enough to check what the API server would decide for a review: literals (strings, integers,
true/false/null, list literals and {}), variables, field selection, indexing, `has()`, `size()`,
`in`, `.startsWith()`, `.exists(x, p)` over lists and map keys, `.map(x, e)` over lists, `!`,
`&&`, `||`, `? :` and the comparisons.  Errors follow CEL: a missing field or a wrong type is an error value, and `&&`
and `||` absorb it when the other side decides (`true || error` is true); an error that reaches
the top is what the API server answers with failurePolicy (Fail: the request is rejected).

Anything outside that subset raises CelSyntaxError, so a condition that grows past it fails
the tests instead of being half-evaluated.
"""

import re

TOKEN = re.compile(r"""\s*(?:
    (?P<num>\d+)
  | (?P<str>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
  | (?P<op>\|\||&&|==|!=|<=|>=|[!<>()\[\]{}.,?:])
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
)""", re.VERBOSE)


class CelSyntaxError(Exception):
    pass


class CelError:
    """A CEL error value."""

    def __init__(self, why):
        self.why = why

    def __repr__(self):
        return f"CelError({self.why!r})"


def tokenize(text):
    out, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        m = TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise CelSyntaxError(f"cannot read {text[pos:pos + 20]!r}")
        pos = m.end()
        kind = m.lastgroup
        value = m.group(kind)
        if kind == "str":
            value = value[1:-1].encode().decode("unicode_escape")
        elif kind == "num":
            value = int(value)
        out.append((kind, value))
    out.append(("end", None))
    return out


class Parser:
    """Recursive descent over CEL's precedence: ?:, ||, &&, relations, !, member, primary."""

    def __init__(self, text):
        self.toks = tokenize(text)
        self.i = 0
        self.variables = set()

    def peek(self, value=None):
        kind, v = self.toks[self.i]
        return v == value and kind in ("op", "ident") if value is not None else (kind, v)

    def take(self, value=None):
        kind, v = self.toks[self.i]
        if value is not None and not (v == value and kind in ("op", "ident")):
            raise CelSyntaxError(f"expected {value!r}, got {v!r}")
        self.i += 1
        return kind, v

    def parse(self):
        node = self.expr()
        if self.peek()[0] != "end":
            raise CelSyntaxError(f"unexpected {self.peek()[1]!r}")
        return node

    def expr(self, scope=()):
        cond = self.binary("||", scope)
        if self.peek("?"):
            self.take("?")
            a = self.expr(scope)
            self.take(":")
            return ("cond", cond, a, self.expr(scope))
        return cond

    def binary(self, op, scope):
        sub = (lambda: self.binary("&&", scope)) if op == "||" else (lambda: self.relation(scope))
        node = sub()
        while self.peek(op):
            self.take(op)
            node = (op, node, sub())
        return node

    def relation(self, scope):
        node = self.unary(scope)
        for op in ("==", "!=", "<=", ">=", "<", ">", "in"):
            if self.peek(op):
                self.take(op)
                return (op, node, self.unary(scope))
        return node

    def unary(self, scope):
        if self.peek("!"):
            self.take("!")
            return ("!", self.unary(scope))
        return self.member(scope)

    def member(self, scope):
        node = self.primary(scope)
        while True:
            if self.peek("."):
                self.take(".")
                _, name = self.take()
                if self.peek("("):
                    self.take("(")
                    if name in ("exists", "map"):
                        _, var = self.take()
                        self.take(",")
                        pred = self.expr(scope + (var,))
                        self.take(")")
                        node = (name, node, var, pred)
                    elif name == "startsWith":
                        arg = self.expr(scope)
                        self.take(")")
                        node = ("startsWith", node, arg)
                    else:
                        raise CelSyntaxError(f"method {name} is outside the subset")
                else:
                    node = ("field", node, name)
            elif self.peek("["):
                self.take("[")
                key = self.expr(scope)
                self.take("]")
                node = ("index", node, key)
            else:
                return node

    def primary(self, scope):
        kind, v = self.take()
        if kind == "num" or kind == "str":
            return ("lit", v)
        if kind == "ident" and v in ("true", "false", "null"):
            return ("lit", {"true": True, "false": False, "null": None}[v])
        if kind == "ident" and v in ("has", "size"):
            self.take("(")
            arg = self.expr(scope)
            self.take(")")
            if v == "has" and arg[0] != "field":
                raise CelSyntaxError("has() needs a field selection")
            return (v, arg)
        if kind == "ident":
            if v not in scope:
                self.variables.add(v)
            return ("var", v)
        if v == "(":
            node = self.expr(scope)
            self.take(")")
            return node
        if v == "[":
            items = []
            while not self.peek("]"):
                if items:
                    self.take(",")
                items.append(self.expr(scope))
            self.take("]")
            return ("list",) + tuple(items)
        if v == "{":
            self.take("}")
            return ("lit", {})
        raise CelSyntaxError(f"unexpected {v!r}")


def compile_cel(text):
    """The tree of a CEL expression and the variables it reads."""
    p = Parser(text)
    return p.parse(), p.variables


def is_err(v):
    return isinstance(v, CelError)


def cel_equal(a, b):
    if type(a) is not type(b) and not (isinstance(a, (int, float)) and isinstance(b, (int, float))):
        return False
    return a == b


def evaluate(node, env):
    op = node[0]
    if op == "lit":
        return node[1]
    if op == "var":
        return env[node[1]] if node[1] in env else CelError(f"undeclared {node[1]}")
    if op in ("||", "&&"):
        decisive = op == "||"
        a, b = evaluate(node[1], env), evaluate(node[2], env)
        for v in (a, b):
            if v is decisive:
                return decisive
        for v in (a, b):
            if is_err(v):
                return v
            if not isinstance(v, bool):
                return CelError(f"no such overload: {op} on {type(v).__name__}")
        return not decisive
    if op == "cond":
        c = evaluate(node[1], env)
        if not isinstance(c, bool):
            return c if is_err(c) else CelError("condition is not a bool")
        return evaluate(node[2] if c else node[3], env)
    if op == "!":
        v = evaluate(node[1], env)
        return (not v) if isinstance(v, bool) else (v if is_err(v) else CelError("! on non-bool"))
    if op == "has":
        target = evaluate(node[1][1], env)
        if is_err(target):
            return target
        if not isinstance(target, dict):
            return CelError("has() on a non-map")
        return node[1][2] in target
    if op == "exists":
        target = evaluate(node[1], env)
        if is_err(target):
            return target
        if not isinstance(target, (list, dict)):
            return CelError("exists on a non-container")
        result = False
        for item in target:
            v = evaluate(node[3], {**env, node[2]: item})
            if v is True:
                return True
            if is_err(v) or not isinstance(v, bool):
                result = v if is_err(v) else CelError("exists predicate is not a bool")
        return result
    if op == "map":
        target = evaluate(node[1], env)
        if is_err(target):
            return target
        if not isinstance(target, list):
            return CelError("map on a non-list")
        out = [evaluate(node[3], {**env, node[2]: item}) for item in target]
        return next((v for v in out if is_err(v)), out)
    values = [evaluate(n, env) for n in node[1:] if isinstance(n, tuple)]
    for v in values:
        if is_err(v):
            return v
    if op == "list":
        return values
    if op == "field":
        target = values[0]
        if not isinstance(target, dict):
            return CelError(f"field {node[2]} of a non-map")
        return target[node[2]] if node[2] in target else CelError(f"no such key: {node[2]}")
    if op == "index":
        target, key = values
        if isinstance(target, dict):
            return target[key] if key in target else CelError(f"no such key: {key}")
        if isinstance(target, list) and isinstance(key, int):
            return target[key] if 0 <= key < len(target) else CelError("index out of range")
        return CelError("index on a non-container")
    if op == "size":
        v = values[0]
        return len(v) if isinstance(v, (str, list, dict)) else CelError("size() of a scalar")
    if op == "in":
        item, container = values
        if isinstance(container, (list, dict)):
            return any(cel_equal(item, c) for c in container)
        return CelError("in on a non-container")
    if op == "startsWith":
        s, prefix = values
        if isinstance(s, str) and isinstance(prefix, str):
            return s.startswith(prefix)
        return CelError("startsWith on a non-string")
    a, b = values
    if op == "==":
        return cel_equal(a, b)
    if op == "!=":
        return not cel_equal(a, b)
    if type(a) is not type(b) or not isinstance(a, (int, str)):
        return CelError(f"no such overload: {op}")
    return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]
