/*
 * The collector's native path: OTLP protobuf trace exports straight into the
 * store's columns, scanning on the way the texts redaction reads for what its rules
 * need.
 *
 * append_record() reads an ExportTraceServiceRequest from its wire bytes without
 * building protobuf message objects, and writes each span as the row the authority's
 * span (spanmill.spans.detect_and_decode) would make, or answers None for "ask the
 * authority". It is strict: an unknown field, a field repeated where one is expected,
 * a value of a kind the store does not keep as it is, a bad id or name, invalid UTF-8
 * or anything malformed answers None, and the authority then says what the spans are
 * or why the record is refused. Nothing here recurses: arrays of arrays are refused.
 *
 * What the Python steps must finish it still writes, and notes the record's rows in
 * Columns.steps: a text that redaction reads (names, status messages, string values)
 * holding one of some literals followed by enough bytes of a set, or a run of decimal
 * digits (what every built-in redaction pattern needs to match); a key translation
 * looks for; a reward; a key the attribute lists drop.
 *
 * The columns are Arrow's buffers (columns()), from which the table is made without
 * a Python object per value, and handed over without a copy (finish()).
 * configure_rows() tells it the schema's columns, their kinds and the promoted
 * attributes.
 *
 * All of these are methods of a Decoder: its settings, its key cache and the Columns
 * it made are its own, and the module holds no state that changes once it has loaded.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <stddef.h>
#include <string.h>

enum { WT_VARINT = 0, WT_I64 = 1, WT_LEN = 2, WT_I32 = 5 };
/* Results of the readers below: ERROR with a Python exception set, UNUSUAL without. */
enum { ERROR = -1, UNUSUAL = 0, OK = 1 };

typedef struct {
    const uint8_t *p;
    const uint8_t *end;
} Buf;

typedef struct {
    uint32_t number;
    int wire;
    uint64_t varint; /* WT_VARINT, WT_I64, WT_I32 */
    Buf bytes;       /* WT_LEN */
} Field;

/* The span record's limits (configure); beyond them, the authority decides. */
typedef struct {
    int ready;
    Py_ssize_t max_name_chars;
    Py_ssize_t max_key_chars;
    Py_ssize_t max_value_bytes;
} Config;

/* Span kinds' and status codes' names, interned once when the module loads. */
static PyObject *KIND_NAMES[6];
static PyObject *STATUS_NAMES[3];

enum { K_STR = 0, K_INT = 1, K_FLOAT = 2, K_BOOL = 3, K_INT_LIST = 4, K_FLOAT_LIST = 5 };
#define MAX_PROMOTED 64

typedef struct {
    PyObject *key;
    Py_ssize_t column;
    int kind;
} PromotedSpec;

enum {
    C_REWARDS, C_MODEL, C_EPISODE, C_TRACE, C_SPAN, C_PARENT, C_NAME, C_KIND, C_START, C_END,
    C_STATUS, C_MESSAGE, C_ATTRIBUTES, C_RESOURCE, C_SCOPE_NAME, C_SCOPE_VERSION, C_EVENTS,
    C_LINKS, C_TOPIC, C_PARTITION, C_OFFSET, C_INDEX, C_TIMESTAMP, C_REWARD_VALUE, C_COUNT
};

typedef struct {
    int ready;
    Py_ssize_t width;
    int *kinds; /* per column, A_* */
    Py_ssize_t index[C_COUNT];
    PromotedSpec promoted[MAX_PROMOTED];
    Py_ssize_t promoted_count;
    PromotedSpec resource[MAX_PROMOTED];
    Py_ssize_t resource_count;
    /* attribute keys: response model, request model, episode id, score value, reward name */
    PyObject *response_model, *request_model, *episode_id, *score, *reward_name;
    PyObject *reward_event;          /* the evaluation result event's name */
    int fused; /* the columns are laid out as append_record writes them */
    unsigned long generation; /* counts configure_rows() calls; Columns carry theirs */
    /* per column, the largest values, offsets and validity a finished Columns held: what
     * new Columns reserve, so that a batch's buffers are not copied as they grow */
    Py_ssize_t (*sizes)[3];
} RowsConfig;

typedef struct {
    PyObject *fallback; /* the keys the caller gave that send a record back to it */
    PyObject *verdicts; /* key -> bool: whether the attribute lists keep a key, for the
                           keys they have judged (a dict the caller owns and fills between
                           calls); None: they keep every key */
    PyObject *classes;  /* key -> what it is to a row (R_* and a promoted index), for
                           promoted, role and fallback keys; other keys are plain */
    unsigned long generation; /* of classes and verdicts, as the key cache's slots know them */
} FusedState;

/* Attribute keys' bytes to their str, and what each is to a row (see key_slot). */
#define KEY_SLOTS 1024
#define KEY_MAX_BYTES 64

typedef struct {
    PyObject *key;
    long what;                /* what the key is to a row, as of `generation` */
    unsigned long generation; /* 0: not known */
    Py_ssize_t size;          /* the key's bytes, kept here: a lookup reads this slot alone */
    uint8_t bytes[KEY_MAX_BYTES];
} KeySlot;

typedef struct {
    const uint8_t *literal;
    Py_ssize_t length;
    Py_ssize_t anchor;      /* the literal's least common byte in text: the one sought */
    const uint8_t *allowed; /* 256 flags: the bytes that may follow the literal */
    Py_ssize_t need;        /* how many of them must */
} Gate;

#define MAX_GATES 64

enum { PLAIN = 0, START = 1, DIGIT = 2, SEPARATOR = 4, WIDE = 8 };

/* The texts of the spans being decoded that redaction would read, and what is sought:
 * gates, each byte's kind, and by anchor byte the gates anchored on it (first[c]: a
 * gate's index plus one, 0 for none; then next[] along the gates that share it). */
typedef struct {
    Py_ssize_t count;
    Py_ssize_t need;
    uint8_t kind[256];
    uint8_t first[256];
    uint8_t next[MAX_GATES];
    int found;
    Gate gates[MAX_GATES]; /* last: a copy takes the `count` in use */
} Scan;

/* Everything a decoder knows and remembers, owned by a Decoder object: the module itself
 * keeps nothing that changes after it loads, so two decoders never see each other's
 * settings, key caches or Columns. */
typedef struct {
    PyObject_HEAD
    Config cfg;
    RowsConfig rows;
    FusedState fused;
    KeySlot key_cache[KEY_SLOTS];
    PyObject *gates; /* the gates last parsed, into scan: a record's scan starts as a copy */
    Scan scan;
} Decoder;

static inline int read_varint(Buf *b, uint64_t *out)
{
    if (b->p < b->end && *b->p < 0x80) { /* most varints here are one byte */
        *out = *b->p++;
        return 1;
    }
    uint64_t value = 0;
    for (int shift = 0; shift < 70 && b->p < b->end; shift += 7) {
        uint8_t byte = *b->p++;
        if (shift == 63 && byte > 1)
            return 0; /* more than 64 bits */
        value |= (uint64_t)(byte & 0x7F) << shift;
        if (!(byte & 0x80)) {
            *out = value;
            return 1;
        }
    }
    return 0;
}

/* The next field of a message; 0 at its end, -1 when the bytes are malformed. */
static inline int next_field(Buf *b, Field *f)
{
    uint64_t tag;
    if (b->p >= b->end)
        return 0;
    const uint8_t *start = b->p;
    /* The parser refuses a tag of more than 5 bytes, whatever its value. */
    if (!read_varint(b, &tag) || b->p - start > 5 || tag > UINT32_MAX || (tag >> 3) == 0)
        return -1;
    f->number = (uint32_t)(tag >> 3);
    f->wire = (int)(tag & 7);
    switch (f->wire) {
    case WT_VARINT:
        return read_varint(b, &f->varint) ? 1 : -1;
    case WT_I64:
        if (b->end - b->p < 8)
            return -1;
        memcpy(&f->varint, b->p, 8); /* little-endian on every platform we build for */
        b->p += 8;
        return 1;
    case WT_I32: {
        uint32_t value;
        if (b->end - b->p < 4)
            return -1;
        memcpy(&value, b->p, 4);
        f->varint = value;
        b->p += 4;
        return 1;
    }
    case WT_LEN: {
        uint64_t length;
        const uint8_t *start = b->p;
        /* A length of more than 5 bytes is left to the parser to judge. */
        if (!read_varint(b, &length) || b->p - start > 5 || length > (uint64_t)(b->end - b->p))
            return -1;
        f->bytes.p = b->p;
        f->bytes.end = b->p + length;
        b->p += length;
        return 1;
    }
    default:
        return -1; /* groups are not used by OTLP */
    }
}

/* A field seen for the second time where the message holds one: let the authority merge. */
static int once(uint32_t *seen, uint32_t number)
{
    if (number >= 32)
        return 0;
    uint32_t bit = 1u << number;
    if (*seen & bit)
        return 0;
    *seen |= bit;
    return 1;
}

/* Strict UTF-8 text; UNUSUAL (error cleared) when the bytes are not valid UTF-8. */
static int text(Buf bytes, PyObject **out)
{
    *out = PyUnicode_DecodeUTF8((const char *)bytes.p, bytes.end - bytes.p, NULL);
    if (*out != NULL)
        return OK;
    if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
        PyErr_Clear();
        return UNUSUAL;
    }
    return ERROR;
}

/* The length of the valid UTF-8 sequence at p and its code point; 0 if none starts there. */
static int utf8_at(const uint8_t *p, const uint8_t *end, Py_UCS4 *cp)
{
    uint8_t lead = p[0];
    int size;
    Py_UCS4 value, min;
    if (lead >= 0xC2 && lead <= 0xDF) {
        size = 2, value = lead & 0x1F, min = 0x80;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
        size = 3, value = lead & 0x0F, min = 0x800;
    } else if (lead >= 0xF0 && lead <= 0xF4) {
        size = 4, value = lead & 0x07, min = 0x10000;
    } else {
        return 0;
    }
    if (end - p < size)
        return 0;
    for (int i = 1; i < size; i++) {
        if ((p[i] & 0xC0) != 0x80)
            return 0;
        value = (value << 6) | (p[i] & 0x3F);
    }
    if (value < min || value > 0x10FFFF || (value >= 0xD800 && value <= 0xDFFF))
        return 0;
    *cp = value;
    return size;
}

/* Whether the bytes are strict UTF-8, as Python's decoder takes it; *chars: how many
 * characters they hold. */
static int utf8_valid(Buf bytes, Py_ssize_t *chars)
{
    const uint8_t *p = bytes.p;
    Py_ssize_t extra = 0; /* the bytes after the first of each longer character */
    while (p < bytes.end) {
        if (bytes.end - p >= 8) {
            uint64_t word;
            memcpy(&word, p, 8);
            if (!(word & 0x8080808080808080ULL)) {
                p += 8;
                continue;
            }
        }
        if (*p < 0x80) {
            p++;
            continue;
        }
        Py_UCS4 cp;
        int size = utf8_at(p, bytes.end, &cp);
        if (size == 0)
            return 0;
        extra += size - 1;
        p += size;
    }
    if (chars != NULL)
        *chars = (bytes.end - bytes.p) - extra;
    return 1;
}

/* A string field that is not kept must still be valid UTF-8, as the parser demands. */
static int valid_text(Buf bytes)
{
    return utf8_valid(bytes, NULL) ? OK : UNUSUAL;
}

static int bounded_name(Decoder *st, Buf bytes, PyObject **out)
{
    int status = text(bytes, out);
    if (status != OK)
        return status;
    Py_ssize_t length = PyUnicode_GET_LENGTH(*out);
    if (length == 0 || length > st->cfg.max_name_chars) {
        Py_CLEAR(*out);
        return UNUSUAL;
    }
    return OK;
}

/* A trace or span id: exactly `size` bytes, not all zero. */
static int id_ok(Buf bytes, Py_ssize_t size)
{
    int nonzero = 0;
    if (bytes.end - bytes.p != size)
        return 0;
    for (Py_ssize_t i = 0; i < size; i++)
        nonzero |= bytes.p[i];
    return nonzero != 0;
}

/* An id's bytes as lowercase hex, two characters a byte, at `out`. */
static void write_hex(Buf id, char *out)
{
    static const char HEX[] = "0123456789abcdef";
    for (Py_ssize_t i = 0; i < id.end - id.p; i++) {
        out[2 * i] = HEX[id.p[i] >> 4];
        out[2 * i + 1] = HEX[id.p[i] & 15];
    }
}

/* A trace or span id as lowercase hex: exactly `size` bytes, not all zero. */
static int hex_id(Buf bytes, Py_ssize_t size, PyObject **out)
{
    if (!id_ok(bytes, size))
        return UNUSUAL;
    *out = PyUnicode_New(2 * size, 127);
    if (*out == NULL)
        return ERROR;
    write_hex(bytes, (char *)PyUnicode_1BYTE_DATA(*out));
    return OK;
}


/* Bytes of English text and JSON values, the most common first; any other is rarer. */
static const char COMMON[] = " etaoinsrhldcumfpgwybv,.-\"kjqxz";

/* The position in a literal of the byte least common in text (the first of equals): the
 * scan stops at each byte some gate is anchored on, and most stops are no gate. */
static Py_ssize_t anchor_of(const uint8_t *literal, Py_ssize_t length)
{
    Py_ssize_t best = 0, best_rank = -1;
    for (Py_ssize_t i = 0; i < length; i++) {
        const char *at = literal[i] ? strchr(COMMON, literal[i]) : NULL;
        Py_ssize_t rank = at != NULL ? at - COMMON : (Py_ssize_t)sizeof COMMON;
        if (rank > best_rank)
            best = i, best_rank = rank;
    }
    return best;
}

static int parse_gates(PyObject *gates, Gate *out, Py_ssize_t *count)
{
    Py_ssize_t n = PyTuple_GET_SIZE(gates);
    if (n > MAX_GATES) {
        PyErr_SetString(PyExc_ValueError, "too many gates");
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *spec = PyTuple_GET_ITEM(gates, i), *literal, *table;
        if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 3
            || !PyBytes_Check(literal = PyTuple_GET_ITEM(spec, 0)) || PyBytes_GET_SIZE(literal) == 0
            || !PyBytes_Check(table = PyTuple_GET_ITEM(spec, 1))
            || PyBytes_GET_SIZE(table) != 256) {
            PyErr_SetString(PyExc_TypeError,
                            "a gate is (literal: non-empty bytes, table: bytes[256], count)");
            return -1;
        }
        Py_ssize_t need = PyLong_AsSsize_t(PyTuple_GET_ITEM(spec, 2));
        if (need == -1 && PyErr_Occurred())
            return -1;
        out[i].literal = (const uint8_t *)PyBytes_AS_STRING(literal);
        out[i].length = PyBytes_GET_SIZE(literal);
        out[i].anchor = anchor_of(out[i].literal, out[i].length);
        out[i].allowed = (const uint8_t *)PyBytes_AS_STRING(table);
        out[i].need = need;
    }
    *count = n;
    return 0;
}

/* Whether the gate's literal, and what must follow it, lie where its anchor byte is at
 * `p` (a text runs from `start` to `end`). */
static int gate_here(const Gate *gate, const uint8_t *start, const uint8_t *p,
                     const uint8_t *end)
{
    if (p - start < gate->anchor || end - (p -= gate->anchor) < gate->length)
        return 0;
    if (memcmp(p, gate->literal, (size_t)gate->length) != 0)
        return 0;
    const uint8_t *q = p + gate->length;
    Py_ssize_t run = 0;
    while (run < gate->need && q < end && gate->allowed[*q])
        run++, q++;
    return run >= gate->need;
}


/* What each byte may begin (a literal, a digit, a separator, a longer character), and
 * the gates each byte begins. */
static void byte_kinds(Scan *scanning)
{
    memset(scanning->kind, PLAIN, 128);
    memset(scanning->kind + 128, WIDE, 128);
    memset(scanning->first, 0, sizeof scanning->first);
    for (int c = '0'; c <= '9'; c++)
        scanning->kind[c] = DIGIT;
    scanning->kind[' '] = scanning->kind['-'] = SEPARATOR;
    for (Py_ssize_t g = scanning->count - 1; g >= 0; g--) {
        uint8_t lead = scanning->gates[g].literal[scanning->gates[g].anchor];
        scanning->kind[lead] |= START;
        scanning->next[g] = scanning->first[lead];
        scanning->first[lead] = (uint8_t)(g + 1);
    }
}

/*
 * One pass over the bytes: at each byte a gate is anchored on, the gates anchored on it
 * are tried; and decimal digits (any script) are counted in runs, a single
 * space or dash allowed between two, until `need` of them (need 0: no run is looked for).
 */
static int scan(const uint8_t *p, const uint8_t *end, const Scan *s)
{
    const uint8_t *kind = s->kind, *start = p;
    Py_ssize_t digits = 0, need = s->need;
    int separated = 0;
    while (p < end) {
        if (digits == 0) {
            /* No run under way: on to the next byte that may start a literal, a digit or
             * a longer character (most bytes start none). */
            while (p < end && !(kind[*p] & (START | DIGIT | WIDE)))
                p++;
            if (p == end)
                break;
            separated = 0;
        }
        uint8_t c = *p, k = kind[c];
        if (k == PLAIN) {
            digits = separated = 0;
            p++;
            continue;
        }
        if (k & START)
            for (int g = s->first[c]; g; g = s->next[g - 1])
                if (gate_here(&s->gates[g - 1], start, p, end))
                    return 1;
        int digit = k & DIGIT, size = 1;
        if (k & WIDE) {
            Py_UCS4 cp;
            size = utf8_at(p, end, &cp);
            digit = size > 0 && Py_UNICODE_ISDECIMAL(cp);
            if (size == 0)
                size = 1;
        }
        if (digit) {
            if (need > 0 && ++digits >= need)
                return 1;
            separated = 0;
        } else if ((k & SEPARATOR) && digits > 0 && !separated) {
            separated = 1;
        } else {
            digits = separated = 0;
        }
        /* The bytes inside a longer character start no literal: gates are ASCII. */
        p += size;
    }
    return 0;
}

/* The four hex digits at p as a number; -1 if they are not. */
static long hex4(const uint8_t *p, const uint8_t *end)
{
    long value = 0;
    if (end - p < 4)
        return -1;
    for (int i = 0; i < 4; i++) {
        int c = p[i], digit = c >= '0' && c <= '9'   ? c - '0'
                              : c >= 'a' && c <= 'f' ? c - 'a' + 10
                              : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                                     : -1;
        if (digit < 0)
            return -1;
        value = value * 16 + digit;
    }
    return value;
}

static uint8_t *put_utf8(uint8_t *out, Py_UCS4 cp)
{
    if (cp < 0x80) {
        *out++ = (uint8_t)cp;
    } else if (cp < 0x800) {
        *out++ = (uint8_t)(0xC0 | cp >> 6);
        *out++ = (uint8_t)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        *out++ = (uint8_t)(0xE0 | cp >> 12);
        *out++ = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
        *out++ = (uint8_t)(0x80 | (cp & 0x3F));
    } else {
        *out++ = (uint8_t)(0xF0 | cp >> 18);
        *out++ = (uint8_t)(0x80 | (cp >> 12 & 0x3F));
        *out++ = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
        *out++ = (uint8_t)(0x80 | (cp & 0x3F));
    }
    return out;
}

/* One JSON escape at p (just after its backslash) decoded to out; where p resumes. An
 * escape JSON does not have is kept as written; a lone surrogate gives nothing, which
 * can only join what it parts (a scan that finds more, never less). */
static const uint8_t *unescape_one(const uint8_t *p, const uint8_t *end, uint8_t **out)
{
    static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
    const char *at = p < end && *p ? strchr(from, *p) : NULL;
    if (at != NULL) {
        *(*out)++ = (uint8_t)to[at - from];
        return p + 1;
    }
    long cp = p < end && *p == 'u' ? hex4(p + 1, end) : -1;
    if (cp < 0) {
        *(*out)++ = '\\';
        return p;
    }
    p += 5;
    if (cp >= 0xD800 && cp <= 0xDBFF && end - p >= 6 && p[0] == '\\' && p[1] == 'u') {
        long low = hex4(p + 2, end);
        if (low >= 0xDC00 && low <= 0xDFFF) {
            *out = put_utf8(*out, (Py_UCS4)(0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00)));
            return p + 6;
        }
    }
    if (cp < 0xD800 || cp > 0xDFFF)
        *out = put_utf8(*out, (Py_UCS4)cp);
    return p;
}

/* Whether the scan finds a gate or a digit run in `bytes` with its JSON escapes decoded
 * (never longer than as written). A text too large to copy is taken as found. */
static int scan_unescaped(Buf bytes, const Scan *scanning)
{
    uint8_t small[4096], *buffer = small;
    size_t length = (size_t)(bytes.end - bytes.p);
    if (length > sizeof small && (buffer = PyMem_RawMalloc(length)) == NULL)
        return 1;
    uint8_t *out = buffer;
    const uint8_t *p = bytes.p;
    while (p < bytes.end) {
        const uint8_t *slash = memchr(p, '\\', (size_t)(bytes.end - p));
        const uint8_t *stop = slash != NULL ? slash : bytes.end;
        memcpy(out, p, (size_t)(stop - p));
        out += stop - p;
        p = slash != NULL ? unescape_one(slash + 1, bytes.end, &out) : bytes.end;
    }
    int found = scan(buffer, out, scanning);
    if (buffer != small)
        PyMem_RawFree(buffer);
    return found;
}

/* Scan one text for the append_record() call's gates; `scanning` is NULL when it asked for
 * none. Each call has its own: Python code (a finalizer) may run, and let another thread
 * decode, while one is under way. */
static void scan_text(Scan *scanning, Buf bytes)
{
    if (scanning == NULL || scanning->found)
        return;
    scanning->found = scan(bytes.p, bytes.end, scanning);
    /* Redaction matches a JSON document's strings as decoded, and JSON may write what a
     * rule needs as an escape ("\u0040" for "@"): such a text is scanned decoded too. */
    if (!scanning->found && bytes.p < bytes.end && (*bytes.p == '[' || *bytes.p == '{')
        && memchr(bytes.p, '\\', (size_t)(bytes.end - bytes.p)) != NULL)
        scanning->found = scan_unescaped(bytes, scanning);
}

/* The kinds of AnyValue the fast path keeps; anything else is for the authority. */
enum { V_NONE = 0, V_STRING = 1, V_BOOL = 2, V_INT = 3, V_DOUBLE = 4, V_ARRAY = 5 };

/* The one field of an AnyValue: its kind, or V_NONE for an empty, doubled or other value. */
static int any_value(Buf value, Field *out)
{
    Field f = {0};
    int kind = V_NONE, more;
    while ((more = next_field(&value, &f)) == 1) {
        if (kind != V_NONE)
            return V_NONE; /* a oneof set twice: the last would win, the authority knows */
        switch (f.number) {
        case V_STRING:
        case V_ARRAY:
            if (f.wire != WT_LEN)
                return V_NONE;
            break;
        case V_BOOL:
        case V_INT:
            if (f.wire != WT_VARINT)
                return V_NONE;
            break;
        case V_DOUBLE:
            if (f.wire != WT_I64)
                return V_NONE;
            break;
        default:
            return V_NONE; /* kvlist, bytes, string indexes, unknown fields */
        }
        kind = (int)f.number;
        *out = f;
    }
    return more == 0 ? kind : V_NONE;
}

static int scalar(Decoder *st, int kind, const Field *f, PyObject **out, Scan *scanning)
{
    double number;
    switch (kind) {
    case V_STRING:
        if (f->bytes.end - f->bytes.p > st->cfg.max_value_bytes)
            return UNUSUAL;
        scan_text(scanning, f->bytes);
        return text(f->bytes, out);
    case V_BOOL:
        *out = Py_NewRef(f->varint ? Py_True : Py_False);
        return OK;
    case V_INT:
        *out = PyLong_FromLongLong((long long)(int64_t)f->varint);
        return *out ? OK : ERROR;
    case V_DOUBLE:
        memcpy(&number, &f->varint, 8);
        *out = PyFloat_FromDouble(number);
        return *out ? OK : ERROR;
    default:
        return UNUSUAL;
    }
}

/* An ArrayValue whose items all hold one scalar kind, as a list. */
static int array(Decoder *st, Buf bytes, PyObject **out, Scan *scanning)
{
    Field f = {0}, item = {0};
    int more = 0, first = V_NONE, status;
    PyObject *list = PyList_New(0), *value;
    if (list == NULL)
        return ERROR;
    while ((more = next_field(&bytes, &f)) == 1) {
        if (f.number != 1 || f.wire != WT_LEN)
            goto unusual;
        int kind = any_value(f.bytes, &item);
        if (kind == V_NONE || kind == V_ARRAY || (first != V_NONE && kind != first))
            goto unusual;
        first = kind;
        status = scalar(st, kind, &item, &value, scanning);
        if (status != OK) {
            Py_DECREF(list);
            return status;
        }
        status = PyList_Append(list, value);
        Py_DECREF(value);
        if (status < 0) {
            Py_DECREF(list);
            return ERROR;
        }
    }
    if (more < 0)
        goto unusual;
    *out = list;
    return OK;
unusual:
    Py_DECREF(list);
    return UNUSUAL;
}

/*
 * Attribute keys repeat from span to span: a small cache maps a key's bytes to its
 * str, which then comes with its hash already computed, and to what the key is to a
 * store row (append_record's classes). A slot holds the last ASCII key that hashed to
 * it; a miss decodes the key and takes the slot.
 */

/* A slot for these bytes (eight at a time, multiplied in); NULL for a key not cached. */
static inline KeySlot *key_slot(Decoder *st, Buf bytes)
{
    Py_ssize_t size = bytes.end - bytes.p;
    if (size == 0 || size > KEY_MAX_BYTES)
        return NULL;
    uint64_t hash = (uint64_t)size * 0x9E3779B97F4A7C15ULL, word = 0;
    const uint8_t *p = bytes.p;
    for (; bytes.end - p > 8; p += 8) {
        memcpy(&word, p, 8);
        hash = (hash ^ word) * 0xFF51AFD7ED558CCDULL;
        hash ^= hash >> 32;
    }
    if (size >= 8) { /* the last eight bytes, overlapping the words before */
        memcpy(&word, bytes.end - 8, 8);
    } else {
        for (Py_ssize_t i = 0; i < size; i++)
            word |= (uint64_t)p[i] << (8 * i);
    }
    hash = (hash ^ word) * 0xFF51AFD7ED558CCDULL;
    hash ^= hash >> 32;
    return &st->key_cache[hash & (KEY_SLOTS - 1)];
}

static inline int slot_holds(const KeySlot *slot, Buf bytes)
{
    Py_ssize_t size = bytes.end - bytes.p;
    return slot->key != NULL && slot->size == size && memcmp(slot->bytes, bytes.p, size) == 0;
}

/* The key of these bytes (a new reference), and its slot where it has one. */
static int cached_key_slot(Decoder *st, Buf bytes, PyObject **out, KeySlot **slot_out)
{
    KeySlot *slot = key_slot(st, bytes);
    *slot_out = NULL;
    if (slot != NULL && slot_holds(slot, bytes)) {
        *out = Py_NewRef(slot->key);
        *slot_out = slot;
        return OK;
    }
    int status = text(bytes, out);
    if (status == OK && slot != NULL && PyUnicode_IS_ASCII(*out)) {
        (void)PyObject_Hash(*out); /* computed once, kept in the str */
        Py_XSETREF(slot->key, Py_NewRef(*out));
        slot->generation = 0;
        slot->size = bytes.end - bytes.p;
        memcpy(slot->bytes, bytes.p, slot->size);
        *slot_out = slot;
    }
    return status;
}

static int cached_key(Decoder *st, Buf bytes, PyObject **out)
{
    KeySlot *slot;
    return cached_key_slot(st, bytes, out, &slot);
}

/* One KeyValue's key and value: each once, the value of a kind the store keeps. */
static int key_and_value(Buf bytes, Buf *key, Field *value, int *kind)
{
    Field f = {0}, key_field = {0}, value_field = {0};
    uint32_t seen = 0;
    int more;
    while ((more = next_field(&bytes, &f)) == 1) {
        if ((f.number != 1 && f.number != 2) || f.wire != WT_LEN || !once(&seen, f.number))
            return UNUSUAL;
        if (f.number == 1)
            key_field = f;
        else
            value_field = f;
    }
    if (more < 0 || seen != ((1u << 1) | (1u << 2)))
        return UNUSUAL;
    *kind = any_value(value_field.bytes, value);
    if (*kind == V_NONE)
        return UNUSUAL;
    *key = key_field.bytes;
    return OK;
}

/* A key decoded is within the record's limits; UNUSUAL (and the key let go) if not. */
static int key_in_limits(Decoder *st, PyObject **name)
{
    Py_ssize_t length = PyUnicode_GET_LENGTH(*name);
    if (length == 0 || length > st->cfg.max_key_chars) {
        Py_CLEAR(*name);
        return UNUSUAL;
    }
    return OK;
}

/* A value as an attribute's, as the authority's span keeps it, into `*dict` (made if NULL). */
static int kept_value(Decoder *st, PyObject **dict, PyObject *name, int kind, const Field *value,
                      Scan *scanning)
{
    PyObject *item;
    int status = kind == V_ARRAY ? array(st, value->bytes, &item, scanning)
                                 : scalar(st, kind, value, &item, scanning);
    if (status != OK)
        return status;
    if (*dict == NULL && (*dict = PyDict_New()) == NULL)
        status = ERROR;
    else if (PyDict_SetItem(*dict, name, item) < 0)
        status = ERROR;
    Py_DECREF(item);
    return status;
}

/* One KeyValue into a dict: a plain key and a value of a kind the store keeps. */
static int key_value(Decoder *st, Buf bytes, PyObject *dict, Scan *scanning)
{
    Field value = {0};
    Buf key;
    int kind;
    PyObject *name;
    int status = key_and_value(bytes, &key, &value, &kind);
    if (status != OK || (status = cached_key(st, key, &name)) != OK
        || (status = key_in_limits(st, &name)) != OK)
        return status;
    status = kept_value(st, &dict, name, kind, &value, scanning);
    Py_DECREF(name);
    return status;
}

/* Skip a field that is not kept, checking the wire type the schema gives it. */
static int skipped(const Field *f, int wire, int is_text)
{
    if (f->wire != wire)
        return UNUSUAL;
    return is_text ? valid_text(f->bytes) : OK;
}

static int attributes_field(Decoder *st, const Field *f, PyObject *dict, Scan *scanning)
{
    if (f->wire != WT_LEN)
        return UNUSUAL;
    return key_value(st, f->bytes, dict, scanning);
}

/* Span.Event: (name, time_unix_nano, attributes). */
static int event_of(Decoder *st, Buf bytes, PyObject **out, Scan *scanning)
{
    Field f = {0};
    uint32_t seen = 0;
    uint64_t time = 0;
    int more = 0, status = OK;
    Buf name = {NULL, NULL};
    PyObject *attributes = PyDict_New(), *text_name = NULL, *time_obj = NULL;
    if (attributes == NULL)
        return ERROR;
    while (status == OK && (more = next_field(&bytes, &f)) == 1) {
        if (f.number != 3 && !once(&seen, f.number)) {
            status = UNUSUAL;
            break;
        }
        switch (f.number) {
        case 1:
            status = f.wire == WT_I64 ? OK : UNUSUAL;
            time = f.varint;
            break;
        case 2:
            status = f.wire == WT_LEN ? OK : UNUSUAL;
            name = f.bytes;
            break;
        case 3:
            status = attributes_field(st, &f, attributes, scanning);
            break;
        case 4:
            status = skipped(&f, WT_VARINT, 0);
            break;
        default:
            status = UNUSUAL;
        }
    }
    if (status == OK && more < 0)
        status = UNUSUAL;
    if (status == OK) {
        if (name.p == NULL)
            status = UNUSUAL;
        else
            status = bounded_name(st, name, &text_name);
    }
    if (status == OK) {
        time_obj = PyLong_FromUnsignedLongLong(time);
        if (time_obj == NULL)
            status = ERROR;
    }
    if (status == OK) {
        *out = PyTuple_Pack(3, text_name, time_obj, attributes);
        if (*out == NULL)
            status = ERROR;
    }
    Py_XDECREF(text_name);
    Py_XDECREF(time_obj);
    Py_DECREF(attributes);
    return status;
}

/* Span.Link: (trace_id, span_id, attributes). */
static int link_of(Decoder *st, Buf bytes, PyObject **out, Scan *scanning)
{
    Field f = {0};
    uint32_t seen = 0;
    int more = 0, status = OK;
    Buf trace = {NULL, NULL}, span = {NULL, NULL};
    PyObject *attributes = PyDict_New(), *trace_hex = NULL, *span_hex = NULL;
    if (attributes == NULL)
        return ERROR;
    while (status == OK && (more = next_field(&bytes, &f)) == 1) {
        if (f.number != 4 && !once(&seen, f.number)) {
            status = UNUSUAL;
            break;
        }
        switch (f.number) {
        case 1:
            status = f.wire == WT_LEN ? OK : UNUSUAL;
            trace = f.bytes;
            break;
        case 2:
            status = f.wire == WT_LEN ? OK : UNUSUAL;
            span = f.bytes;
            break;
        case 3:
            status = skipped(&f, WT_LEN, 1);
            break;
        case 4:
            status = attributes_field(st, &f, attributes, scanning);
            break;
        case 5:
            status = skipped(&f, WT_VARINT, 0);
            break;
        case 6:
            status = skipped(&f, WT_I32, 0);
            break;
        default:
            status = UNUSUAL;
        }
    }
    if (status == OK && more < 0)
        status = UNUSUAL;
    if (status == OK)
        status = hex_id(trace, 16, &trace_hex);
    if (status == OK)
        status = hex_id(span, 8, &span_hex);
    if (status == OK) {
        *out = PyTuple_Pack(3, trace_hex, span_hex, attributes);
        if (*out == NULL)
            status = ERROR;
    }
    Py_XDECREF(trace_hex);
    Py_XDECREF(span_hex);
    Py_DECREF(attributes);
    return status;
}

static const uint8_t NOTHING[1] = {0};
/* An empty text, or a field not given: p == end, and not NULL. */
static const Buf NONE = {NOTHING, NOTHING};

/* Status: its code and message's bytes (unchanged where not given). */
static int status_texts(Buf bytes, uint64_t *code, Buf *message)
{
    Field f = {0};
    uint32_t seen = 0;
    int more;
    *code = 0;
    while ((more = next_field(&bytes, &f)) == 1) {
        if (!once(&seen, f.number))
            return UNUSUAL;
        if (f.number == 2 && f.wire == WT_LEN)
            *message = f.bytes;
        else if (f.number == 3 && f.wire == WT_VARINT)
            *code = f.varint;
        else
            return UNUSUAL;
    }
    return more < 0 || *code > 2 ? UNUSUAL : OK;
}

/* A Span's own fields, each given once with its wire type, as the parser takes them;
 * `repeated` reads its attributes (9), events (11) and links (13). A field not given
 * reads as empty: an empty name is refused all the same, and a status not given is
 * an unset one with no message. */
typedef struct {
    Buf trace, span_id, parent, name, status;
    uint64_t kind, start, end;
} SpanFields;

typedef int (*Repeated)(const Field *f, void *context);

static int span_fields(Buf bytes, SpanFields *out, Repeated repeated, void *context)
{
    Field f = {0};
    uint32_t seen = 0;
    int more = 0, status = OK;
    *out = (SpanFields){NONE, NONE, NONE, NONE, NONE, 0, 0, 0};
    while (status == OK && (more = next_field(&bytes, &f)) == 1) {
        if (f.number != 9 && f.number != 11 && f.number != 13 && !once(&seen, f.number))
            return UNUSUAL;
        switch (f.number) {
        case 1:
        case 2:
        case 4:
        case 5:
        case 15:
            if (f.wire != WT_LEN)
                return UNUSUAL;
            *(f.number == 1   ? &out->trace
              : f.number == 2 ? &out->span_id
              : f.number == 4 ? &out->parent
              : f.number == 5 ? &out->name
                              : &out->status) = f.bytes;
            break;
        case 3:
            status = skipped(&f, WT_LEN, 1);
            break;
        case 6:
            status = f.wire == WT_VARINT ? OK : UNUSUAL;
            out->kind = f.varint;
            break;
        case 7:
        case 8:
            status = f.wire == WT_I64 ? OK : UNUSUAL;
            *(f.number == 7 ? &out->start : &out->end) = f.varint;
            break;
        case 9:
        case 11:
        case 13:
            status = repeated(&f, context);
            break;
        case 10:
        case 12:
        case 14:
            status = skipped(&f, WT_VARINT, 0);
            break;
        case 16:
            status = skipped(&f, WT_I32, 0);
            break;
        default:
            return UNUSUAL;
        }
    }
    if (status == OK && (more < 0 || out->end < out->start || out->kind > 5))
        status = UNUSUAL;
    return status;
}

/* A Span's repeated fields, as the authority's span keeps them. attributes NULL: they are read
 * later (the fused path, once the span's hour is known); events and links NULL: made
 * at the first of each. */
typedef struct {
    Decoder *st;
    PyObject *attributes, *events, *links;
    Scan *scanning;
} SpanLists;

static int span_lists(const Field *f, void *context)
{
    SpanLists *lists = context;
    Decoder *st = lists->st;
    if (f->number == 9 && lists->attributes == NULL)
        return f->wire == WT_LEN ? OK : UNUSUAL;
    if (f->number == 9)
        return attributes_field(st, f, lists->attributes, lists->scanning);
    if (f->wire != WT_LEN)
        return UNUSUAL;
    PyObject **list = f->number == 11 ? &lists->events : &lists->links, *item = NULL;
    if (*list == NULL && (*list = PyList_New(0)) == NULL)
        return ERROR;
    int status = f->number == 11 ? event_of(st, f->bytes, &item, lists->scanning)
                                 : link_of(st, f->bytes, &item, lists->scanning);
    if (status == OK && PyList_Append(*list, item) < 0)
        status = ERROR;
    Py_XDECREF(item);
    return status;
}

/* InstrumentationScope: the bytes of its name and version; its attributes are left to
 * the authority. */
static int scope_texts(Buf bytes, Buf *name, Buf *version)
{
    Field f = {0};
    uint32_t seen = 0;
    int more;
    *name = *version = NONE;
    while ((more = next_field(&bytes, &f)) == 1) {
        if (!once(&seen, f.number))
            return UNUSUAL;
        if (f.number == 1 && f.wire == WT_LEN)
            *name = f.bytes;
        else if (f.number == 2 && f.wire == WT_LEN)
            *version = f.bytes;
        else if (!(f.number == 4 && f.wire == WT_VARINT))
            return UNUSUAL;
    }
    return more < 0 ? UNUSUAL : OK;
}

/* The messages that hold a header (resource, scope) and then many items (scopes, spans),
 * in any order on the wire: the header is found first, then the items are read. */
typedef struct {
    uint32_t header;     /* field number of the one header message */
    uint32_t items;      /* field number of the repeated items */
    uint32_t schema_url; /* field number of a string that is checked and dropped */
} Layout;

static int find_header(Buf bytes, const Layout *layout, Buf *header)
{
    Field f = {0};
    uint32_t seen = 0;
    int more;
    header->p = header->end = NULL;
    while ((more = next_field(&bytes, &f)) == 1) {
        if (f.wire != WT_LEN)
            return UNUSUAL;
        if (f.number == layout->items)
            continue;
        if (!once(&seen, f.number))
            return UNUSUAL;
        if (f.number == layout->header) {
            *header = f.bytes;
        } else if (f.number == layout->schema_url) {
            int status = valid_text(f.bytes);
            if (status != OK)
                return status;
        } else {
            return UNUSUAL;
        }
    }
    return more < 0 ? UNUSUAL : OK;
}

static const Layout SCOPE_SPANS = {1, 2, 3};
static const Layout RESOURCE_SPANS = {1, 2, 3};

/* A call's scan state for these gates and digit run. The same gates come with every
 * call: they are parsed once and kept, with a reference, for the calls after. */
static int scan_setup(Decoder *st, PyObject *gates, PyObject *digits, Scan *state)
{
    if (!PyTuple_Check(gates)) {
        PyErr_SetString(PyExc_TypeError, "gates must be a tuple");
        return -1;
    }
    Py_ssize_t need = PyLong_AsSsize_t(digits);
    if (need == -1 && PyErr_Occurred())
        return -1;
    if (gates == st->gates) {
        memcpy(state, &st->scan, offsetof(Scan, gates) + (size_t)st->scan.count * sizeof(Gate));
    } else {
        /* Parsed into this call's own state first: parsing may run Python code. */
        if (parse_gates(gates, state->gates, &state->count) < 0)
            return -1;
        byte_kinds(state);
        memcpy(&st->scan, state, sizeof st->scan);
        Py_XSETREF(st->gates, Py_NewRef(gates)); /* keeps the literals and tables alive */
    }
    state->need = need;
    state->found = need < 0; /* no test to make: every record counts as found */
    return 0;
}

/* ---- span parts into store columns ---------------------------------------- */


/* ---- columns as Arrow buffers ------------------------------------------------
 * A Columns object holds one batch's rows the way Arrow lays them out: values,
 * offsets (strings, lists) and a validity bitmap per column, so a table is made
 * from its buffers without looking at a Python object per value. Columns of kinds
 * with no buffer layout here (rewards' structs) keep their values in a list.
 */
enum { A_STR = 0, A_I64 = 1, A_I32 = 2, A_F64 = 3, A_BOOL = 4, A_LIST_I64 = 5,
       A_LIST_F64 = 6, A_OBJECT = 7 };

typedef struct {
    char *data;
    Py_ssize_t size, capacity;
} Bytes;

typedef struct {
    int kind;
    Bytes values;   /* the values; of a list column, its items */
    Bytes offsets;  /* int32 offsets, for strings and lists: a 0, then each row's end */
    Bytes validity; /* one bit per row, set where the value is not null */
    Py_ssize_t nulls, items;
    PyObject *objects; /* A_OBJECT: the values, as a list */
} Column;

typedef struct {
    Py_ssize_t values, offsets, validity, nulls, items, objects;
} Mark;

typedef struct {
    PyObject_HEAD
    Py_ssize_t width, rows;
    Column *columns;
    Mark *marks;  /* where each column stood before the row being appended */
    Mark *record; /* and before the record being appended (append_record) */
    PyObject *owner;          /* the Decoder whose columns() made them */
    unsigned long generation; /* its configure_rows() they were made for */
    int finished;             /* finish() took their buffers: no more rows */
    PyObject *steps; /* [(first row, end, found)]: rows the Python steps are to finish */
} ColumnsObject;

static PyTypeObject ColumnsType;

/* Strings and lists have offsets; the other kinds are fixed-width or objects. */
static int has_offsets(int kind)
{
    return kind == A_STR || kind == A_LIST_I64 || kind == A_LIST_F64;
}

/* Room for `size` bytes in all, allocated now. */
static int presize(Bytes *b, Py_ssize_t size)
{
    if (size <= b->capacity)
        return 0;
    char *data = PyMem_Realloc(b->data, (size_t)size);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = data;
    b->capacity = size;
    return 0;
}

/* Room for `more` bytes past the end: the capacity doubles until they fit. */
static int reserve(Bytes *b, Py_ssize_t more)
{
    if (b->size + more <= b->capacity)
        return 0;
    Py_ssize_t capacity = b->capacity ? b->capacity : 256;
    while (capacity < b->size + more)
        capacity *= 2;
    return presize(b, capacity);
}

static int push(Bytes *b, const void *data, Py_ssize_t size)
{
    if (size == 0)
        return 0; /* nothing to copy; an empty buffer may not be allocated yet */
    if (reserve(b, size) < 0)
        return -1;
    memcpy(b->data + b->size, data, (size_t)size);
    b->size += size;
    return 0;
}

static int push_bit(Bytes *bits, Py_ssize_t index, int set)
{
    if (index % 8 == 0) {
        uint8_t zero = 0;
        if (push(bits, &zero, 1) < 0)
            return -1;
    }
    if (set)
        bits->data[index / 8] |= (char)(1u << (index % 8));
    return 0;
}

/* The next offset of a string or list column: ends past 2**31-1 are refused. */
static int push_offset(Column *c, Py_ssize_t end)
{
    if (end > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError,
                        "a column of one batch holds more than 2 GiB; lower "
                        "SPANMILL_COLLECTOR_BATCH_MAX_BYTES");
        return -1;
    }
    int32_t offset = (int32_t)end;
    return push(&c->offsets, &offset, 4);
}

/* TypeError: a value of the wrong type for its column; returns -1. */
static int wrong_type(const char *expected, PyObject *value)
{
    PyErr_Format(PyExc_TypeError, "expected %s, not %.100s", expected, Py_TYPE(value)->tp_name);
    return -1;
}

static int int64_of(PyObject *value, int64_t *out)
{
    if (!PyLong_Check(value) || PyBool_Check(value))
        return wrong_type("an int", value);
    long long number = PyLong_AsLongLong(value);
    if (number == -1 && PyErr_Occurred())
        return -1;
    *out = (int64_t)number;
    return 0;
}

static int double_of(PyObject *value, double *out)
{
    if (PyFloat_CheckExact(value)) {
        *out = PyFloat_AS_DOUBLE(value);
        return 0;
    }
    if (!PyFloat_Check(value) && (!PyLong_Check(value) || PyBool_Check(value)))
        return wrong_type("a float", value);
    *out = PyFloat_AsDouble(value);
    return *out == -1.0 && PyErr_Occurred() ? -1 : 0;
}

/* An int onto an int64 or int32 column's values; OverflowError where it does not fit. */
static int push_int(Column *c, int64_t number)
{
    if (c->kind == A_I64)
        return push(&c->values, &number, 8);
    if (number < INT32_MIN || number > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "value out of the int32 range");
        return -1;
    }
    int32_t small = (int32_t)number;
    return push(&c->values, &small, 4);
}

/* One row's value onto a column; None is null. */
static int column_append(Column *c, Py_ssize_t row, PyObject *value)
{
    if (c->kind == A_OBJECT)
        return PyList_Append(c->objects, value);
    int present = value != Py_None;
    if (!present)
        c->nulls++;
    if (push_bit(&c->validity, row, present) < 0)
        return -1;
    switch (c->kind) {
    case A_STR: {
        if (present) {
            if (!PyUnicode_Check(value))
                return wrong_type("a str", value);
            Py_ssize_t size;
            const char *utf8 = PyUnicode_AsUTF8AndSize(value, &size);
            if (utf8 == NULL || push(&c->values, utf8, size) < 0)
                return -1;
        }
        return push_offset(c, c->values.size);
    }
    case A_I64:
    case A_I32: {
        int64_t number = 0;
        if (present && int64_of(value, &number) < 0)
            return -1;
        return push_int(c, number);
    }
    case A_F64: {
        double number = 0.0;
        if (present && double_of(value, &number) < 0)
            return -1;
        return push(&c->values, &number, 8);
    }
    case A_BOOL:
        if (present && !PyBool_Check(value))
            return wrong_type("a bool", value);
        return push_bit(&c->values, row, value == Py_True);
    case A_LIST_I64:
    case A_LIST_F64: {
        if (present) {
            if (!PyList_Check(value))
                return wrong_type("a list", value);
            Py_ssize_t n = PyList_GET_SIZE(value);
            if (reserve(&c->values, n * 8) < 0)
                return -1;
            for (Py_ssize_t i = 0; i < n; i++) {
                PyObject *item = PyList_GET_ITEM(value, i);
                char *at = c->values.data + c->values.size + i * 8;
                if (c->kind == A_LIST_I64) {
                    int64_t number;
                    if (int64_of(item, &number) < 0)
                        return -1;
                    memcpy(at, &number, 8);
                } else {
                    double number;
                    if (double_of(item, &number) < 0)
                        return -1;
                    memcpy(at, &number, 8);
                }
            }
            c->values.size += n * 8;
            c->items += n;
        }
        return push_offset(c, c->items);
    }
    default:
        PyErr_SetString(PyExc_SystemError, "unknown column kind");
        return -1;
    }
}

/* Note where every column stands, before a row (marks) or a record's rows (record). */
static void columns_mark(ColumnsObject *self, Mark *marks)
{
    for (Py_ssize_t i = 0; i < self->width; i++) {
        Column *c = &self->columns[i];
        marks[i] = (Mark){c->values.size, c->offsets.size, c->validity.size, c->nulls,
                          c->items, c->objects ? PyList_GET_SIZE(c->objects) : 0};
    }
}

/* Take back rows that failed part way: every column as it was at the mark, when the
 * columns held `row` st->rows. */
static void columns_rollback(ColumnsObject *self, const Mark *marks, Py_ssize_t row)
{
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback); /* the row's error, kept for the caller */
    self->rows = row;
    for (Py_ssize_t i = 0; i < self->width; i++) {
        Column *c = &self->columns[i];
        const Mark *m = &marks[i];
        c->values.size = m->values;
        c->offsets.size = m->offsets;
        c->validity.size = m->validity;
        c->nulls = m->nulls;
        c->items = m->items;
        /* The bits of the row taken back, in a byte kept, are cleared again. */
        if (row % 8 && c->validity.size > row / 8)
            c->validity.data[row / 8] &= (char)((1u << (row % 8)) - 1);
        if (c->kind == A_BOOL && row % 8 && c->values.size > row / 8)
            c->values.data[row / 8] &= (char)((1u << (row % 8)) - 1);
        if (c->objects && PyList_GET_SIZE(c->objects) > m->objects)
            PyList_SetSlice(c->objects, m->objects, PyList_GET_SIZE(c->objects), NULL);
    }
    PyErr_Restore(type, value, traceback);
}

static void columns_dealloc(ColumnsObject *self)
{
    if (self->columns != NULL) {
        for (Py_ssize_t i = 0; i < self->width; i++) {
            Column *c = &self->columns[i];
            PyMem_Free(c->values.data);
            PyMem_Free(c->offsets.data);
            PyMem_Free(c->validity.data);
            Py_XDECREF(c->objects);
        }
        PyMem_Free(self->columns);
    }
    PyMem_Free(self->marks);
    PyMem_Free(self->record);
    Py_XDECREF(self->steps);
    Py_XDECREF(self->owner);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* A column's buffer handed over to Arrow by finish(): its memory, not a copy of it,
 * read through the buffer protocol and freed when Arrow lets go of it. */
typedef struct {
    PyObject_HEAD
    char *data;
    Py_ssize_t size;
} BufferObject;

static int buffer_get(BufferObject *self, Py_buffer *view, int flags)
{
    return PyBuffer_FillInfo(view, (PyObject *)self, self->data ? self->data : (char *)NOTHING,
                             self->size, 1, flags);
}

static void buffer_dealloc(BufferObject *self)
{
    PyMem_Free(self->data);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyBufferProcs buffer_procs = {(getbufferproc)buffer_get, NULL};

static PyTypeObject BufferType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "spanmill._native.Buffer",
    .tp_basicsize = sizeof(BufferObject),
    .tp_dealloc = (destructor)buffer_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A finished column's buffer, read-only, through the buffer protocol.",
    .tp_as_buffer = &buffer_procs,
};

/* The buffer's memory as a Buffer; the column holds none after. */
static PyObject *handed_over(Bytes *b)
{
    BufferObject *out = PyObject_New(BufferObject, &BufferType);
    if (out == NULL)
        return NULL;
    out->data = b->data;
    out->size = b->size;
    *b = (Bytes){NULL, 0, 0};
    return (PyObject *)out;
}

/* finish() -> [list | (nulls, validity | None, offsets | None, values, items)] per column:
 * the buffers themselves, not copies; the Columns take no rows after. */
static PyObject *columns_finish(ColumnsObject *self, PyObject *Py_UNUSED(ignored))
{
    if (self->finished) {
        PyErr_SetString(PyExc_RuntimeError, "these Columns were finished already");
        return NULL;
    }
    PyObject *out = PyList_New(self->width);
    if (out == NULL)
        return NULL;
    self->finished = 1;
    Decoder *owner = (Decoder *)self->owner;
    if (owner->rows.sizes != NULL && owner->rows.generation == self->generation)
        for (Py_ssize_t i = 0; i < self->width; i++) {
            const Column *c = &self->columns[i];
            Py_ssize_t *size = owner->rows.sizes[i];
            size[0] = Py_MAX(size[0], c->values.size);
            size[1] = Py_MAX(size[1], c->offsets.size);
            size[2] = Py_MAX(size[2], c->validity.size);
        }
    for (Py_ssize_t i = 0; i < self->width; i++) {
        Column *c = &self->columns[i];
        PyObject *item;
        if (c->kind == A_OBJECT) {
            item = PyList_GetSlice(c->objects, 0, PyList_GET_SIZE(c->objects));
        } else {
            PyObject *validity = c->nulls ? handed_over(&c->validity) : Py_NewRef(Py_None);
            PyObject *offset_bytes =
                has_offsets(c->kind) ? handed_over(&c->offsets) : Py_NewRef(Py_None);
            PyObject *values = handed_over(&c->values);
            item = validity && offset_bytes && values
                       ? Py_BuildValue("(nOOOn)", c->nulls, validity, offset_bytes, values, c->items)
                       : NULL;
            Py_XDECREF(validity);
            Py_XDECREF(offset_bytes);
            Py_XDECREF(values);
        }
        if (item == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, item);
    }
    return out;
}

static PyObject *columns_rows(ColumnsObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromSsize_t(self->rows);
}

static PyObject *columns_steps(ColumnsObject *self, void *Py_UNUSED(closure))
{
    return PyList_AsTuple(self->steps);
}

static PyMethodDef columns_methods[] = {
    {"finish", (PyCFunction)columns_finish, METH_NOARGS,
     "finish() -> per column, a list of its values (kinds kept as objects) or "
     "(null count, validity bitmap or None, int32 offsets or None, values, list items)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef columns_getset[] = {
    {"rows", (getter)columns_rows, NULL, "rows appended", NULL},
    {"steps", (getter)columns_steps, NULL,
     "((first row, end, found), ...): the rows of records the Python steps are to finish (a "
     "redaction find, a key for translation, a reward, a key the attribute lists drop); "
     "found false: the scan found nothing a redaction pattern needs",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ColumnsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "spanmill._native.Columns",
    .tp_basicsize = sizeof(ColumnsObject),
    .tp_dealloc = (destructor)columns_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One store table's rows as Arrow buffers; made by columns(), filled by "
              "append_record().",
    .tp_methods = columns_methods,
    .tp_getset = columns_getset,
};

/* The plain columns append_record fills, by name; their indexes come from configure_rows. */
static const char *const ROW_COLUMNS[] = {
    "rewards",        "model",          "episode_id",          "trace_id",
    "span_id",        "parent_span_id", "name",                "kind",
    "start_time",     "end_time",       "status_code",         "status_message",
    "attributes",     "resource_attributes", "scope_name",     "scope_version",
    "events",         "links",          "kafka_topic",         "kafka_partition",
    "kafka_offset",   "kafka_index",    "kafka_timestamp",     "reward_value",
};



static int fused_layout_ok(Decoder *st);

static int parse_promoted(PyObject *specs, PyObject *names, PromotedSpec *out, Py_ssize_t *count)
{
    if (!PyTuple_Check(specs) || PyTuple_GET_SIZE(specs) > MAX_PROMOTED) {
        PyErr_SetString(PyExc_TypeError, "promoted: a tuple of (key, column, kind)");
        return -1;
    }
    *count = 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(specs); i++) {
        PyObject *spec = PyTuple_GET_ITEM(specs, i);
        if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 3
            || !PyUnicode_Check(PyTuple_GET_ITEM(spec, 0))) {
            PyErr_SetString(PyExc_TypeError, "promoted: a tuple of (key, column, kind)");
            return -1;
        }
        Py_ssize_t column = PySequence_Index(names, PyTuple_GET_ITEM(spec, 1));
        long kind = PyLong_AsLong(PyTuple_GET_ITEM(spec, 2));
        if (column < 0 || (kind == -1 && PyErr_Occurred()))
            return -1;
        if (kind < K_STR || kind > K_FLOAT_LIST) {
            PyErr_SetString(PyExc_ValueError, "promoted: unknown kind");
            return -1;
        }
        for (Py_ssize_t j = 0; j < i; j++) {
            int same = PyUnicode_Compare(out[j].key, PyTuple_GET_ITEM(spec, 0));
            if (same == -1 && PyErr_Occurred())
                return -1;
            if (same == 0) {
                PyErr_SetString(PyExc_ValueError, "promoted: a key is given twice");
                return -1;
            }
        }
        out[i].key = Py_NewRef(PyTuple_GET_ITEM(spec, 0));
        PyUnicode_InternInPlace(&out[i].key);
        out[i].column = column;
        out[i].kind = (int)kind;
        *count = i + 1; /* what is held so far, for clear_rows() */
    }
    return 0;
}

static PyObject *interned(PyObject *text)
{
    if (!PyUnicode_Check(text)) {
        PyErr_SetString(PyExc_TypeError, "expected a str");
        return NULL;
    }
    PyObject *out = Py_NewRef(text);
    PyUnicode_InternInPlace(&out);
    return out;
}

static void clear_rows(Decoder *st)
{
    for (Py_ssize_t i = 0; i < st->rows.promoted_count; i++)
        Py_CLEAR(st->rows.promoted[i].key);
    for (Py_ssize_t i = 0; i < st->rows.resource_count; i++)
        Py_CLEAR(st->rows.resource[i].key);
    Py_CLEAR(st->rows.response_model);
    Py_CLEAR(st->rows.request_model);
    Py_CLEAR(st->rows.episode_id);
    Py_CLEAR(st->rows.score);
    Py_CLEAR(st->rows.reward_name);
    Py_CLEAR(st->rows.reward_event);
    PyMem_Free(st->rows.kinds);
    st->rows.kinds = NULL;
    PyMem_Free(st->rows.sizes);
    st->rows.sizes = NULL;
    Py_CLEAR(st->fused.classes);
    Py_CLEAR(st->fused.fallback);
    Py_CLEAR(st->fused.verdicts);
    st->fused.generation++;
    st->rows.promoted_count = st->rows.resource_count = 0;
    st->rows.ready = 0;
}

/* configure_rows(columns, promoted, resource_promoted, keys, reward_event, kinds) */
static PyObject *configure_rows(Decoder *st, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6 || !PyTuple_Check(args[0]) || !PyTuple_Check(args[3])
        || PyTuple_GET_SIZE(args[3]) != 5 || !PyTuple_Check(args[5])
        || PyTuple_GET_SIZE(args[5]) != PyTuple_GET_SIZE(args[0])) {
        PyErr_SetString(PyExc_TypeError,
                        "configure_rows(columns, promoted, resource_promoted, "
                        "(response_model, request_model, episode_id, score, reward_name), "
                        "reward_event, kinds): a kind per column");
        return NULL;
    }
    clear_rows(st); /* configured again: the last call wins, earlier Columns are refused */
    st->rows.generation++;
    PyObject *names = args[0];
    st->rows.width = PyTuple_GET_SIZE(names);
    st->rows.kinds = PyMem_Calloc((size_t)st->rows.width, sizeof(int));
    st->rows.sizes = PyMem_Calloc((size_t)st->rows.width, sizeof *st->rows.sizes);
    if (st->rows.kinds == NULL || st->rows.sizes == NULL)
        return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < st->rows.width; i++) {
        long kind = PyLong_AsLong(PyTuple_GET_ITEM(args[5], i));
        if (kind == -1 && PyErr_Occurred())
            return NULL;
        if (kind < A_STR || kind > A_OBJECT) {
            PyErr_SetString(PyExc_ValueError, "kinds: unknown column kind");
            return NULL;
        }
        st->rows.kinds[i] = (int)kind;
    }
    for (int i = 0; i < C_COUNT; i++) {
        PyObject *name = PyUnicode_FromString(ROW_COLUMNS[i]);
        if (name == NULL)
            return NULL;
        st->rows.index[i] = PySequence_Index(names, name);
        Py_DECREF(name);
        if (st->rows.index[i] < 0)
            return NULL;
    }
    if (parse_promoted(args[1], names, st->rows.promoted, &st->rows.promoted_count) < 0
        || parse_promoted(args[2], names, st->rows.resource, &st->rows.resource_count) < 0)
        return NULL;
    PyObject **keys[5] = {&st->rows.response_model, &st->rows.request_model, &st->rows.episode_id,
                          &st->rows.score, &st->rows.reward_name};
    for (int i = 0; i < 5; i++)
        if ((*keys[i] = interned(PyTuple_GET_ITEM(args[3], i))) == NULL)
            return NULL;
    if ((st->rows.reward_event = interned(args[4])) == NULL)
        return NULL;
    st->rows.fused = fused_layout_ok(st);
    st->rows.ready = 1;
    Py_RETURN_NONE;
}

/* ---- the store's JSON ---------------------------------------------------------
 * Attributes without a column, the resource's, events and links are stored as JSON,
 * written here as the store's encoder writes it (json.JSONEncoder with
 * ensure_ascii=False and separators "," and ":"): keys in their order, floats as
 * their repr (NaN and the infinities as NaN, Infinity, -Infinity), control characters
 * escaped. Tests hold the two byte for byte.
 */
static int json_value(Bytes *out, PyObject *value);

static int json_text(Bytes *out, PyObject *text)
{
    Py_ssize_t size;
    const char *p = PyUnicode_AsUTF8AndSize(text, &size), *end, *run;
    if (p == NULL || push(out, "\"", 1) < 0)
        return -1;
    for (run = p, end = p + size; p < end; p++) {
        unsigned char c = (unsigned char)*p;
        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        char escaped[8] = {'\\', (char)c, 0};
        static const char SHORT[] = "\"\"\\\\\bb\ff\nn\rr\tt";
        const char *letter = memchr(SHORT, c, sizeof SHORT - 1);
        Py_ssize_t length = 2;
        if (letter != NULL && (letter - SHORT) % 2 == 0)
            escaped[1] = letter[1];
        else
            length = snprintf(escaped, sizeof escaped, "\\u%04x", c);
        if (push(out, run, p - run) < 0 || push(out, escaped, length) < 0)
            return -1;
        run = p + 1;
    }
    return push(out, run, end - run) < 0 || push(out, "\"", 1) < 0 ? -1 : 0;
}

static int json_number(Bytes *out, PyObject *value)
{
    char buffer[32];
    if (PyLong_CheckExact(value)) { /* int64 attributes; uint64 times of events */
        int overflow;
        long long number = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (overflow > 0) {
            unsigned long long large = PyLong_AsUnsignedLongLong(value);
            if (large == (unsigned long long)-1 && PyErr_Occurred())
                return -1;
            return push(out, buffer, snprintf(buffer, sizeof buffer, "%llu", large));
        }
        if (overflow < 0 || (number == -1 && PyErr_Occurred())) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_OverflowError, "an int below -2**63");
            return -1;
        }
        return push(out, buffer, snprintf(buffer, sizeof buffer, "%lld", number));
    }
    double number = PyFloat_AS_DOUBLE(value);
    if (Py_IS_NAN(number) || Py_IS_INFINITY(number)) {
        const char *word = Py_IS_NAN(number) ? "NaN" : number > 0 ? "Infinity" : "-Infinity";
        return push(out, word, (Py_ssize_t)strlen(word));
    }
    char *repr = PyOS_double_to_string(number, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (repr == NULL)
        return -1;
    int failed = push(out, repr, (Py_ssize_t)strlen(repr));
    PyMem_Free(repr);
    return failed;
}

static int json_value(Bytes *out, PyObject *value)
{
    if (value == Py_None || value == Py_True || value == Py_False) {
        const char *word = value == Py_None ? "null" : value == Py_True ? "true" : "false";
        return push(out, word, (Py_ssize_t)strlen(word));
    }
    if (PyUnicode_CheckExact(value))
        return json_text(out, value);
    if (PyLong_CheckExact(value) || PyFloat_CheckExact(value))
        return json_number(out, value);
    if (PyList_CheckExact(value)) {
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(value); i++)
            if (push(out, i ? "," : "[", 1) < 0 || json_value(out, PyList_GET_ITEM(value, i)) < 0)
                return -1;
        return push(out, PyList_GET_SIZE(value) ? "]" : "[]", PyList_GET_SIZE(value) ? 1 : 2);
    }
    if (PyDict_CheckExact(value)) {
        PyObject *key, *item;
        Py_ssize_t at = 0, i = 0;
        while (PyDict_Next(value, &at, &key, &item))
            if (push(out, i++ ? "," : "{", 1) < 0 || json_text(out, key) < 0
                || push(out, ":", 1) < 0 || json_value(out, item) < 0)
                return -1;
        return push(out, i ? "}" : "{}", i ? 1 : 2);
    }
    PyErr_Format(PyExc_TypeError, "no JSON for %.100s", Py_TYPE(value)->tp_name);
    return -1;
}

/* A row's JSON of a dict or list (the store's JSON), or null where it is NULL or empty. */
static int col_json(Column *c, Py_ssize_t row, PyObject *value)
{
    if (value == NULL || PyObject_Length(value) == 0)
        return column_append(c, row, Py_None);
    if (push_bit(&c->validity, row, 1) < 0 || json_value(&c->values, value) < 0)
        return -1;
    return push_offset(c, c->values.size);
}

/* `lead`, then "key":value. */
static int json_member(Bytes *out, const char *lead, const char *key, PyObject *value)
{
    return push(out, lead, (Py_ssize_t)strlen(lead)) < 0
                   || push(out, key, (Py_ssize_t)strlen(key)) < 0 || push(out, "\":", 2) < 0
                   || json_value(out, value) < 0
               ? -1
               : 0;
}

/* A row's events or links: [{k0: item[0], k1: item[1], "attributes": item[2]}, ...] from
 * their (x, y, attributes) tuples, or null where there are none. */
static int col_records(Column *c, Py_ssize_t row, PyObject *items, const char *k0,
                       const char *k1)
{
    if (items == NULL || PyList_GET_SIZE(items) == 0)
        return column_append(c, row, Py_None);
    Bytes *out = &c->values;
    if (push_bit(&c->validity, row, 1) < 0)
        return -1;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items); i++) {
        PyObject *item = PyList_GET_ITEM(items, i);
        if (json_member(out, i ? ",{\"" : "[{\"", k0, PyTuple_GET_ITEM(item, 0)) < 0
            || json_member(out, ",\"", k1, PyTuple_GET_ITEM(item, 1)) < 0
            || json_member(out, ",\"", "attributes", PyTuple_GET_ITEM(item, 2)) < 0
            || push(out, "}", 1) < 0)
            return -1;
    }
    return push(out, "]", 1) < 0 ? -1 : push_offset(c, c->values.size);
}

/* Whether a list of events (name, time, attributes) holds an evaluation: 1, 0, or -1
 * with an exception set. */
static int evaluation_event(Decoder *st, PyObject *events)
{
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(events); i++) {
        PyObject *event = PyList_GET_ITEM(events, i);
        if (PyTuple_Check(event) && PyTuple_GET_SIZE(event) > 0) {
            int same = PyObject_RichCompareBool(PyTuple_GET_ITEM(event, 0),
                                                st->rows.reward_event, Py_EQ);
            if (same != 0)
                return same;
        }
    }
    return 0;
}

/* columns() -> Columns: an empty table's worth of columns, for append_record(). */
/* Whether `columns` were made by this decoder for its configuration as it stands. */
static int columns_of(Decoder *st, PyObject *columns)
{
    return PyObject_TypeCheck(columns, &ColumnsType)
           && ((ColumnsObject *)columns)->owner == (PyObject *)st
           && ((ColumnsObject *)columns)->generation == st->rows.generation
           && ((ColumnsObject *)columns)->width == st->rows.width
           && !((ColumnsObject *)columns)->finished;
}

static PyObject *new_columns(Decoder *st, PyObject *Py_UNUSED(ignored))
{
    if (!st->rows.ready) {
        PyErr_SetString(PyExc_RuntimeError, "configure_rows() was not called");
        return NULL;
    }
    ColumnsObject *self = PyObject_New(ColumnsObject, &ColumnsType);
    if (self == NULL)
        return NULL;
    self->owner = Py_NewRef((PyObject *)st);
    self->generation = st->rows.generation;
    self->width = st->rows.width;
    self->rows = 0;
    self->finished = 0;
    self->steps = PyList_New(0);
    self->columns = PyMem_Calloc((size_t)st->rows.width, sizeof(Column));
    self->marks = PyMem_Calloc((size_t)st->rows.width, sizeof(Mark));
    self->record = PyMem_Calloc((size_t)st->rows.width, sizeof(Mark));
    if (self->columns == NULL || self->marks == NULL || self->record == NULL
        || self->steps == NULL) {
        PyMem_Free(self->columns);
        self->columns = NULL;
        self->width = 0;
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < st->rows.width; i++) {
        Column *c = &self->columns[i];
        c->kind = st->rows.kinds[i];
        if (c->kind == A_OBJECT && (c->objects = PyList_New(0)) == NULL) {
            Py_DECREF(self);
            return NULL;
        }
        const Py_ssize_t *size = st->rows.sizes[i];
        if (presize(&c->values, size[0]) < 0 || presize(&c->offsets, size[1]) < 0
            || presize(&c->validity, size[2]) < 0) {
            Py_DECREF(self);
            return NULL;
        }
        if (has_offsets(c->kind)) {
            int32_t zero = 0; /* Arrow's offsets start with the first row's start */
            if (push(&c->offsets, &zero, 4) < 0) {
                Py_DECREF(self);
                return NULL;
            }
        }
    }
    return (PyObject *)self;
}

/* ---- wire bytes straight into store columns --------------------------------
 * A span's ids, names, times and promoted attributes go from the payload's bytes into
 * the columns' buffers with no Python object between. Only what the store keeps as
 * JSON (attributes without a column, the resource's, events and links) is built as
 * objects, whose JSON is written here as the store's encoder writes it, so each row is
 * byte for byte what the Python steps give. It answers None, every column as it was, for what the authority
 * must judge, a key given twice where the columns would have to know which value
 * stands, spans of more than RECORD_HOURS hours, or an end time past what the store
 * holds. Spans of several hours go to each hour's columns, all of them taken back
 * together.
 */
#define NS_PER_HOUR 3600000000000ULL

/* What an attribute key is to a span row: the index of its promoted column plus one
 * (0: none) in the low byte, and roles in the bits above. */
enum { R_RESPONSE_MODEL = 1 << 8, R_REQUEST_MODEL = 1 << 9, R_EPISODE = 1 << 10,
       R_STEPS = 1 << 11, R_DROPPED = 1 << 12 };
enum { KEPT = 2 }; /* a value whose kind is not its column's: it stays an attribute */

/* Whether the schema's columns are laid out as append_record writes them. */
static int fused_layout_ok(Decoder *st)
{
    static const int texts[] = {C_MODEL, C_EPISODE, C_TRACE, C_SPAN, C_PARENT, C_NAME, C_KIND,
                                C_STATUS, C_MESSAGE, C_ATTRIBUTES, C_RESOURCE, C_SCOPE_NAME,
                                C_SCOPE_VERSION, C_TOPIC};
    static const int numbers[] = {C_START, C_END, C_PARTITION, C_OFFSET, C_INDEX, C_TIMESTAMP};
    /* K_STR, K_INT, K_FLOAT, K_BOOL, K_INT_LIST, K_FLOAT_LIST */
    static const int layout[] = {A_STR, A_I64, A_F64, A_BOOL, A_LIST_I64, A_LIST_F64};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++)
        if (st->rows.kinds[st->rows.index[texts[i]]] != A_STR)
            return 0;
    for (size_t i = 0; i < sizeof numbers / sizeof numbers[0]; i++) {
        int kind = st->rows.kinds[st->rows.index[numbers[i]]];
        if (kind != A_I64 && kind != A_I32)
            return 0;
    }
    for (Py_ssize_t i = 0; i < st->rows.promoted_count; i++)
        if (st->rows.kinds[st->rows.promoted[i].column] != layout[st->rows.promoted[i].kind])
            return 0;
    for (Py_ssize_t i = 0; i < st->rows.resource_count; i++)
        if (st->rows.kinds[st->rows.resource[i].column] != layout[st->rows.resource[i].kind])
            return 0;
    return 1;
}

/* A text about to be stored: valid UTF-8, scanned (a find marks the record for the steps). */
static int checked_text(Buf bytes, Scan *scanning)
{
    if (!utf8_valid(bytes, NULL))
        return UNUSUAL;
    scan_text(scanning, bytes);
    return OK;
}

static int col_bytes(Column *c, Py_ssize_t row, const void *data, Py_ssize_t size)
{
    if (push_bit(&c->validity, row, 1) < 0 || push(&c->values, data, size) < 0)
        return -1;
    return push_offset(c, c->values.size);
}

static int col_int(Column *c, Py_ssize_t row, int64_t number)
{
    return push_bit(&c->validity, row, 1) < 0 ? -1 : push_int(c, number);
}

static int col_hex(Column *c, Py_ssize_t row, Buf id)
{
    Py_ssize_t size = id.end - id.p;
    if (reserve(&c->values, 2 * size) < 0)
        return -1;
    write_hex(id, c->values.data + c->values.size);
    c->values.size += 2 * size;
    if (push_bit(&c->validity, row, 1) < 0)
        return -1;
    return push_offset(c, c->values.size);
}

/* The kind all of an ArrayValue's items hold (V_NONE when it has none) and how many
 * there are; UNUSUAL where decode's array() defers (mixed, nested, odd items). */
static int array_kind(Buf bytes, int *kind, Py_ssize_t *count)
{
    Field f = {0}, item = {0};
    int more;
    *kind = V_NONE;
    *count = 0;
    while ((more = next_field(&bytes, &f)) == 1) {
        if (f.number != 1 || f.wire != WT_LEN)
            return UNUSUAL;
        int one = any_value(f.bytes, &item);
        if (one == V_NONE || one == V_ARRAY || (*kind != V_NONE && one != *kind))
            return UNUSUAL;
        *kind = one;
        (*count)++;
    }
    return more < 0 ? UNUSUAL : OK;
}

/* Whether a value of this wire kind goes to a column of this promoted kind, as the
 * Python rows judge the value the authority makes of it; `items`: an array's. */
static int value_fits(int column_kind, int kind, const Field *value, Py_ssize_t *items)
{
    int items_kind, status;
    switch (column_kind) {
    case K_STR:
        return kind == V_STRING ? OK : KEPT;
    case K_INT:
        return kind == V_INT ? OK : KEPT;
    case K_FLOAT:
        return kind == V_DOUBLE ? OK : KEPT;
    case K_BOOL:
        return kind == V_BOOL ? OK : KEPT;
    case K_INT_LIST:
    case K_FLOAT_LIST:
        if (kind != V_ARRAY)
            return KEPT;
        if ((status = array_kind(value->bytes, &items_kind, items)) != OK)
            return status;
        if (*items == 0)
            return OK; /* an empty list is a list of either */
        return items_kind == (column_kind == K_INT_LIST ? V_INT : V_DOUBLE) ? OK : KEPT;
    default:
        return KEPT;
    }
}

/* A value value_fits() took, checked (a text's size, UTF-8 and scan) ... */
static int value_checked(Decoder *st, int column_kind, const Field *value, Scan *scanning)
{
    if (column_kind != K_STR)
        return OK;
    if (value->bytes.end - value->bytes.p > st->cfg.max_value_bytes)
        return UNUSUAL;
    return checked_text(value->bytes, scanning);
}

/* ... and onto its column. */
static int value_written(Column *c, Py_ssize_t row, int column_kind, const Field *value,
                         Py_ssize_t items)
{
    double number;
    switch (column_kind) {
    case K_STR:
        return col_bytes(c, row, value->bytes.p, value->bytes.end - value->bytes.p);
    case K_INT:
        return col_int(c, row, (int64_t)value->varint);
    case K_FLOAT:
        memcpy(&number, &value->varint, 8);
        return push_bit(&c->validity, row, 1) < 0 ? -1 : push(&c->values, &number, 8);
    case K_BOOL:
        if (push_bit(&c->validity, row, 1) < 0)
            return -1;
        return push_bit(&c->values, row, value->varint != 0);
    default: { /* lists of int64 or float64: each item's 8 bytes */
        Field f = {0}, item = {0};
        Buf bytes = value->bytes;
        if (reserve(&c->values, items * 8) < 0)
            return -1;
        while (next_field(&bytes, &f) == 1) {
            any_value(f.bytes, &item);
            memcpy(c->values.data + c->values.size, &item.varint, 8);
            c->values.size += 8;
        }
        c->items += items;
        if (push_bit(&c->validity, row, 1) < 0)
            return -1;
        return push_offset(c, c->items);
    }
    }
}

/* A span attribute's key as a str, and what it is to a row (st->fused.classes); UNUSUAL
 * where the attribute lists have not judged it yet (the authority's steps will). */
static int span_key(Decoder *st, Buf bytes, PyObject **name, long *what)
{
    KeySlot *slot;
    int status = cached_key_slot(st, bytes, name, &slot);
    if (status != OK || (status = key_in_limits(st, name)) != OK)
        return status;
    if (slot != NULL && slot->generation == st->fused.generation) {
        *what = slot->what;
        return OK;
    }
    PyObject *found = PyDict_GetItemWithError(st->fused.classes, *name);
    *what = found != NULL ? PyLong_AsLong(found) : 0;
    if (!PyErr_Occurred() && st->fused.verdicts != Py_None) {
        PyObject *kept = PyDict_GetItemWithError(st->fused.verdicts, *name);
        if (kept == NULL && !PyErr_Occurred()) {
            Py_CLEAR(*name);
            return UNUSUAL;
        }
        if (kept == Py_False)
            *what |= R_DROPPED;
    }
    if (PyErr_Occurred()) {
        Py_CLEAR(*name);
        return ERROR;
    }
    if (slot != NULL && slot->key == *name) { /* a verdict, once given, stands */
        slot->what = *what;
        slot->generation = st->fused.generation;
    }
    return OK;
}

/* key -> class, for the promoted keys, the keys a row reads, and `fallback` (the steps');
 * and the attribute lists' verdicts. */
static int fused_classes(Decoder *st, PyObject *fallback, PyObject *verdicts)
{
    if (verdicts != st->fused.verdicts) {
        Py_XSETREF(st->fused.verdicts, Py_NewRef(verdicts));
        st->fused.generation++;
    }
    if (st->fused.classes != NULL && fallback == st->fused.fallback)
        return 0;
    PyObject *classes = PyDict_New();
    if (classes == NULL)
        return -1;
    for (Py_ssize_t i = 0; i < st->rows.promoted_count; i++) {
        PyObject *code = PyLong_FromSsize_t(i + 1);
        int failed = code == NULL || PyDict_SetItem(classes, st->rows.promoted[i].key, code) < 0;
        Py_XDECREF(code);
        if (failed)
            goto error;
    }
    struct {
        PyObject *key;
        long role;
    } roles[] = {
        {st->rows.response_model, R_RESPONSE_MODEL},
        {st->rows.request_model, R_REQUEST_MODEL},
        {st->rows.episode_id, R_EPISODE},
        {st->rows.reward_name, R_STEPS},
        {st->rows.score, R_STEPS},
    };
    PyObject *iterator = PyObject_GetIter(fallback), *key;
    if (iterator == NULL)
        goto error;
    for (size_t i = 0;; i++) {
        if (i < sizeof roles / sizeof roles[0]) {
            key = Py_NewRef(roles[i].key);
        } else if ((key = PyIter_Next(iterator)) == NULL) {
            break;
        }
        long role = i < sizeof roles / sizeof roles[0] ? roles[i].role : R_STEPS;
        PyObject *was = PyDict_GetItemWithError(classes, key), *code;
        long before = was != NULL ? PyLong_AsLong(was) : 0;
        int failed = PyErr_Occurred() != NULL || !PyUnicode_Check(key)
                     || (code = PyLong_FromLong(before | role)) == NULL;
        if (!failed) {
            failed = PyDict_SetItem(classes, key, code) < 0;
            Py_DECREF(code);
        }
        Py_DECREF(key);
        if (failed) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "fallback keys must be str");
            Py_DECREF(iterator);
            goto error;
        }
    }
    Py_DECREF(iterator);
    if (PyErr_Occurred())
        goto error;
    Py_XSETREF(st->fused.classes, classes);
    Py_XSETREF(st->fused.fallback, Py_NewRef(fallback));
    st->fused.generation++;
    return 0;
error:
    Py_DECREF(classes);
    return -1;
}

/* The resource of the spans being appended: its promoted values, its other
 * attributes' JSON. */
typedef struct {
    Field value[MAX_PROMOTED];
    Py_ssize_t items[MAX_PROMOTED];
    uint64_t present; /* a bit per resource column whose value the resource gives */
    PyObject *json;   /* its other attributes' JSON: bytes, or None */
    int steps;        /* a key the attribute lists drop: the steps finish its spans' rows */
} Resource;

/* The hours one record's spans may fall in; a record over more takes the steps. */
#define RECORD_HOURS 8

typedef struct {
    PyObject *hours;         /* hour -> Columns, added where missing */
    ColumnsObject *columns;  /* the hour's of the span being read */
    /* each hour the record's spans fall in, its Columns and their rows before the record */
    ColumnsObject *held[RECORD_HOURS];
    uint64_t hour[RECORD_HOURS];
    Py_ssize_t rows[RECORD_HOURS];
    int held_count;
    Scan *scanning;
    const Resource *resource;
    Buf scope_name, scope_version;
    Buf topic;
    int64_t partition, offset, timestamp;
    Py_ssize_t spans;        /* appended so far: the next span's index in the record */
    int steps;               /* the Python steps finish the record's rows (Columns.steps) */
} Record;

static int resource_of(Decoder *st, Buf header, Resource *out, Scan *scanning)
{
    Field f = {0}, value = {0};
    PyObject *kept = NULL;
    uint64_t seen = 0;
    int more = 0, status = OK, kind;
    Buf key;
    out->present = 0;
    out->steps = 0;
    out->json = NULL;
    while (header.p != NULL && status == OK && (more = next_field(&header, &f)) == 1) {
        if (f.number == 2) {
            status = skipped(&f, WT_VARINT, 0);
            continue;
        }
        if (f.number != 1 || f.wire != WT_LEN) {
            status = UNUSUAL;
            break;
        }
        PyObject *name = NULL;
        long what;
        if ((status = key_and_value(f.bytes, &key, &value, &kind)) != OK
            || (status = span_key(st, key, &name, &what)) != OK)
            break;
        if (what & R_DROPPED) /* the attribute lists drop it: redaction's to do */
            out->steps = 1;
        Py_ssize_t which = -1;
        for (Py_ssize_t i = 0; i < st->rows.resource_count && which < 0; i++) {
            int same = PyUnicode_Compare(name, st->rows.resource[i].key);
            if (same == 0)
                which = i;
        }
        status = KEPT;
        if (which >= 0) {
            if (seen & (1ULL << which)) {
                status = UNUSUAL; /* given twice: the authority's dict knows which stands */
            } else {
                seen |= 1ULL << which;
                status = value_fits(st->rows.resource[which].kind, kind, &value,
                                    &out->items[which]);
                if (status == OK)
                    status = value_checked(st, st->rows.resource[which].kind, &value, scanning);
                if (status == OK) {
                    out->value[which] = value;
                    out->present |= 1ULL << which;
                }
            }
        }
        if (status == KEPT)
            status = kept_value(st, &kept, name, kind, &value, scanning);
        Py_DECREF(name);
    }
    if (status == OK && more < 0)
        status = UNUSUAL;
    if (status == OK) { /* written once, for each of its spans' rows */
        Bytes text = {NULL, 0, 0};
        if (kept == NULL)
            out->json = Py_NewRef(Py_None);
        else if (json_value(&text, kept) == 0)
            out->json = PyBytes_FromStringAndSize(text.data, text.size);
        status = out->json != NULL ? OK : ERROR;
        PyMem_Free(text.data);
    }
    Py_XDECREF(kept);
    return status;
}

/* The record's hour's columns: found or made for its first span; the same for the rest. */
static int columns_of(Decoder *st, PyObject *columns);

static int record_columns(Decoder *st, Record *record, uint64_t hour)
{
    for (int i = 0; i < record->held_count; i++)
        if (record->hour[i] == hour) {
            record->columns = record->held[i];
            return OK;
        }
    if (record->held_count == RECORD_HOURS)
        return UNUSUAL;
    PyObject *key = PyLong_FromUnsignedLongLong(hour), *columns;
    if (key == NULL)
        return ERROR;
    columns = PyDict_GetItemWithError(record->hours, key);
    if (columns != NULL) {
        Py_INCREF(columns);
    } else if (!PyErr_Occurred() && (columns = new_columns(st, NULL)) != NULL
               && PyDict_SetItem(record->hours, key, columns) < 0) {
        Py_CLEAR(columns);
    }
    Py_DECREF(key);
    if (columns == NULL)
        return ERROR;
    if (!columns_of(st, columns)) {
        Py_DECREF(columns);
        PyErr_SetString(PyExc_TypeError,
                        "hours must give unfinished Columns from this decoder's columns() since "
                        "its last configure_rows()");
        return ERROR;
    }
    int at = record->held_count++;
    record->held[at] = record->columns = (ColumnsObject *)columns;
    record->hour[at] = hour;
    record->rows[at] = record->columns->rows;
    columns_mark(record->columns, record->columns->record);
    return OK;
}

/* A span's promoted, model and episode columns, from its attributes; the rest as JSON. */
typedef struct {
    Buf role[3]; /* response model, request model, episode id: the last value given,
                    where it is a non-empty text */
    uint64_t seen, written; /* bits per promoted key: given, and put in its column */
    PyObject *kept;         /* the attributes without a column, or NULL */
    int steps;              /* a key for the steps: translation's, a reward's, or dropped */
} SpanAttributes;

static int span_attribute(Decoder *st, Buf bytes, ColumnsObject *columns, SpanAttributes *span,
                          Scan *scanning)
{
    Field value = {0};
    Buf key;
    int kind, status = key_and_value(bytes, &key, &value, &kind);
    PyObject *name = NULL;
    long what;
    if (status != OK || (status = span_key(st, key, &name, &what)) != OK)
        return status;
    if (what & (R_STEPS | R_DROPPED))
        span->steps = 1;
    static const long ROLES[3] = {R_RESPONSE_MODEL, R_REQUEST_MODEL, R_EPISODE};
    for (int r = 0; r < 3; r++)
        if (what & ROLES[r])
            span->role[r] = kind == V_STRING ? value.bytes : NONE;
    status = KEPT;
    Py_ssize_t index = (what & 0xFF) - 1, items = 0;
    if (index >= 0) {
        const PromotedSpec *spec = &st->rows.promoted[index];
        if (span->seen & (1ULL << index)) {
            status = UNUSUAL; /* given twice: the authority's dict knows which stands */
        } else {
            span->seen |= 1ULL << index;
            status = value_fits(spec->kind, kind, &value, &items);
            if (status == OK)
                status = value_checked(st, spec->kind, &value, scanning);
            if (status == OK) {
                status = value_written(&columns->columns[spec->column], columns->rows,
                                       spec->kind, &value, items) < 0 ? ERROR : OK;
                span->written |= 1ULL << index;
            }
        }
    }
    if (status == KEPT)
        status = kept_value(st, &span->kept, name, kind, &value, scanning);
    Py_DECREF(name);
    return status;
}

/* Whether the Python steps must finish a span's row for its events and links (*steps
 * set): the attribute lists filter keys (theirs too), or an event is an evaluation (a
 * reward). */
static int lists_steps(Decoder *st, const SpanLists *lists, int *steps)
{
    if ((lists->events || lists->links) && st->fused.verdicts != NULL
        && st->fused.verdicts != Py_None)
        *steps = 1;
    int evaluation = lists->events ? evaluation_event(st, lists->events) : 0;
    if (evaluation > 0)
        *steps = 1;
    return evaluation < 0 ? ERROR : OK;
}

/* The promoted columns a span's attributes did not fill, and its resource's columns. */
static int fused_promoted_rest(Decoder *st, const Record *record, const SpanAttributes *span,
                               Column *c, Py_ssize_t row)
{
    for (Py_ssize_t i = 0; i < st->rows.promoted_count; i++)
        if (!(span->written & (1ULL << i))
            && column_append(&c[st->rows.promoted[i].column], row, Py_None) < 0)
            return -1;
    for (Py_ssize_t i = 0; i < st->rows.resource_count; i++) {
        const Resource *resource = record->resource;
        Column *column = &c[st->rows.resource[i].column];
        if (resource->present & (1ULL << i)
                ? value_written(column, row, st->rows.resource[i].kind, &resource->value[i],
                                resource->items[i]) < 0
                : column_append(column, row, Py_None) < 0)
            return -1;
    }
    return 0;
}

/* Every other column of a span's row: its fields, roles, JSON and Kafka record. */
static int fused_columns(Decoder *st, const Record *record, const SpanFields *fields,
                         const SpanAttributes *span, uint64_t code, Buf message,
                         const SpanLists *lists, Column *c, Py_ssize_t row)
{
    const Py_ssize_t *at = st->rows.index;
    Buf trace = fields->trace, parent = fields->parent, name = fields->name;
    const Buf *model = span->role[0].p != span->role[0].end   ? &span->role[0]
                       : span->role[1].p != span->role[1].end ? &span->role[1]
                                                              : NULL;
    Buf episode = span->role[2];
    PyObject *resource = record->resource->json;
    if (col_json(&c[at[C_ATTRIBUTES]], row, span->kept) < 0
        || column_append(&c[at[C_REWARDS]], row, Py_None) < 0
        || (model ? col_bytes(&c[at[C_MODEL]], row, model->p, model->end - model->p)
                  : column_append(&c[at[C_MODEL]], row, Py_None)) < 0
        || (episode.p != episode.end
                ? col_bytes(&c[at[C_EPISODE]], row, episode.p, episode.end - episode.p)
                : col_hex(&c[at[C_EPISODE]], row, trace)) < 0
        || col_hex(&c[at[C_TRACE]], row, trace) < 0
        || col_hex(&c[at[C_SPAN]], row, fields->span_id) < 0
        || (parent.p != parent.end ? col_hex(&c[at[C_PARENT]], row, parent)
                                   : column_append(&c[at[C_PARENT]], row, Py_None)) < 0
        || col_bytes(&c[at[C_NAME]], row, name.p, name.end - name.p) < 0
        || column_append(&c[at[C_KIND]], row, KIND_NAMES[fields->kind]) < 0
        || col_int(&c[at[C_START]], row, (int64_t)fields->start) < 0
        || col_int(&c[at[C_END]], row, (int64_t)fields->end) < 0
        || column_append(&c[at[C_STATUS]], row, STATUS_NAMES[code]) < 0
        || col_bytes(&c[at[C_MESSAGE]], row, message.p, message.end - message.p) < 0
        || (resource != Py_None ? col_bytes(&c[at[C_RESOURCE]], row, PyBytes_AS_STRING(resource),
                                            PyBytes_GET_SIZE(resource))
                                : column_append(&c[at[C_RESOURCE]], row, Py_None)) < 0
        || col_bytes(&c[at[C_SCOPE_NAME]], row, record->scope_name.p,
                     record->scope_name.end - record->scope_name.p) < 0
        || col_bytes(&c[at[C_SCOPE_VERSION]], row, record->scope_version.p,
                     record->scope_version.end - record->scope_version.p) < 0
        || col_records(&c[at[C_EVENTS]], row, lists->events, "name", "time_unix_nano") < 0
        || col_records(&c[at[C_LINKS]], row, lists->links, "trace_id", "span_id") < 0
        || col_bytes(&c[at[C_TOPIC]], row, record->topic.p, record->topic.end - record->topic.p)
               < 0
        || col_int(&c[at[C_PARTITION]], row, record->partition) < 0
        || col_int(&c[at[C_OFFSET]], row, record->offset) < 0
        || col_int(&c[at[C_INDEX]], row, record->spans) < 0
        || col_int(&c[at[C_TIMESTAMP]], row, record->timestamp) < 0)
        return -1;
    return 0;
}

/* One Span as one row of its hour's columns. */
static int fused_span(Decoder *st, Buf bytes, Record *record)
{
    SpanFields fields;
    Field f = {0};
    uint64_t code = 0;
    Buf all = bytes, message = NONE;
    Py_ssize_t name_chars = 0;
    SpanLists lists = {st, NULL, NULL, NULL, record->scanning}; /* attributes: later */
    SpanAttributes attributes = {{NONE, NONE, NONE}, 0, 0, NULL, 0};
    int status = span_fields(bytes, &fields, span_lists, &lists);
    /* The record's rules (decode), then the store's: an end it can hold (check_storable). */
    if (status == OK
        && (fields.end > (uint64_t)INT64_MAX || !id_ok(fields.trace, 16)
            || !id_ok(fields.span_id, 8)
            || (fields.parent.p != fields.parent.end && !id_ok(fields.parent, 8))
            || !utf8_valid(fields.name, &name_chars) || name_chars == 0
            || name_chars > st->cfg.max_name_chars))
        status = UNUSUAL;
    if (status == OK) {
        scan_text(record->scanning, fields.name);
        if ((status = status_texts(fields.status, &code, &message)) == OK)
            status = checked_text(message, record->scanning);
    }
    if (status == OK)
        status = lists_steps(st, &lists, &record->steps);
    if (status == OK)
        status = record_columns(st, record, fields.start / NS_PER_HOUR);
    ColumnsObject *columns = record->columns;
    while (status == OK && next_field(&all, &f) == 1)
        if (f.number == 9)
            status = span_attribute(st, f.bytes, columns, &attributes, record->scanning);
    record->steps |= attributes.steps;
    if (status == OK) /* from here on, only a failing write stops the row */
        status = fused_promoted_rest(st, record, &attributes, columns->columns, columns->rows) < 0
                         || fused_columns(st, record, &fields, &attributes, code, message, &lists,
                                          columns->columns, columns->rows) < 0
                     ? ERROR
                     : OK;
    if (status == OK) {
        columns->rows++;
        record->spans++;
    }
    Py_XDECREF(attributes.kept);
    Py_XDECREF(lists.events);
    Py_XDECREF(lists.links);
    return status;
}

static int fused_scope_spans(Decoder *st, Buf bytes, Record *record)
{
    Buf header, rest = bytes;
    Field f = {0};
    int status = find_header(bytes, &SCOPE_SPANS, &header), more;
    if (status == OK)
        status = scope_texts(header.p ? header : NONE, &record->scope_name,
                             &record->scope_version);
    if (status == OK
        && (!utf8_valid(record->scope_name, NULL) || !utf8_valid(record->scope_version, NULL)))
        status = UNUSUAL;
    while (status == OK && (more = next_field(&rest, &f)) == 1)
        if (f.number == SCOPE_SPANS.items)
            status = fused_span(st, f.bytes, record);
    return status;
}

static int fused_resource_spans(Decoder *st, Buf bytes, Record *record)
{
    Buf header, rest = bytes;
    Field f = {0};
    Resource resource;
    int status = find_header(bytes, &RESOURCE_SPANS, &header), more;
    if (status != OK || (status = resource_of(st, header, &resource, record->scanning)) != OK)
        return status;
    record->steps |= resource.steps;
    record->resource = &resource;
    while (status == OK && (more = next_field(&rest, &f)) == 1)
        if (f.number == RESOURCE_SPANS.items)
            status = fused_scope_spans(st, f.bytes, record);
    record->resource = NULL;
    Py_DECREF(resource.json);
    return status;
}

/* The record's rows, in each hour it fell in, noted for the Python steps to finish, and
 * whether the scan found what a redaction pattern needs (if not, no pattern can match). */
static int steps_marked(const Record *record)
{
    PyObject *found = record->scanning == NULL || record->scanning->found ? Py_True : Py_False;
    for (int i = 0; i < record->held_count; i++) {
        ColumnsObject *columns = record->held[i];
        PyObject *rows = Py_BuildValue("(nnO)", record->rows[i], columns->rows, found);
        int failed = rows == NULL || PyList_Append(columns->steps, rows) < 0;
        Py_XDECREF(rows);
        if (failed)
            return ERROR;
    }
    return OK;
}

static int int64_arg(PyObject *value, int64_t *out)
{
    long long number = PyLong_AsLongLong(value);
    if (number == -1 && PyErr_Occurred())
        return -1;
    *out = (int64_t)number;
    return 0;
}

/* append_record(hours, payload, gates, digits, fallback, verdicts, topic, partition,
 *               offset, timestamp_ms) -> int | None */
static PyObject *append_record(Decoder *st, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view;
    Field f = {0};
    Scan scan_state;
    Record record = {0};
    int more = 0, status = OK, found = 0;
    if (!st->rows.ready || !st->cfg.ready) {
        PyErr_SetString(PyExc_RuntimeError, "configure() and configure_rows() were not called");
        return NULL;
    }
    if (!st->rows.fused) /* the store's columns are not laid out as it writes them */
        Py_RETURN_NONE;
    if (nargs != 10 || !PyDict_Check(args[0]) || (args[5] != Py_None && !PyDict_Check(args[5]))
        || !PyUnicode_Check(args[6])) {
        PyErr_SetString(PyExc_TypeError,
                        "append_record(hours: dict, payload, gates | None, digits, "
                        "fallback_keys, verdicts: dict | None, topic: str, partition, offset, "
                        "timestamp_ms)");
        return NULL;
    }
    if (args[2] != Py_None) {
        if (scan_setup(st, args[2], args[3], &scan_state) < 0)
            return NULL;
        record.scanning = &scan_state;
    }
    Py_ssize_t topic_size;
    const char *topic = PyUnicode_AsUTF8AndSize(args[6], &topic_size);
    if (topic == NULL || fused_classes(st, args[4], args[5]) < 0
        || int64_arg(args[7], &record.partition) < 0 || int64_arg(args[8], &record.offset) < 0
        || int64_arg(args[9], &record.timestamp) < 0)
        return NULL;
    record.topic = (Buf){(const uint8_t *)topic, (const uint8_t *)topic + topic_size};
    record.hours = args[0];
    if (PyObject_GetBuffer(args[1], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    Buf bytes = {(const uint8_t *)view.buf, (const uint8_t *)view.buf + view.len};
    while (status == OK && (more = next_field(&bytes, &f)) == 1) {
        if (f.number != 1 || f.wire != WT_LEN) {
            status = UNUSUAL;
            break;
        }
        found = 1;
        status = fused_resource_spans(st, f.bytes, &record);
    }
    if (status == OK && (more < 0 || !found))
        status = UNUSUAL;
    if (status == OK && (record.steps || (record.scanning != NULL && record.scanning->found)))
        status = steps_marked(&record);
    PyBuffer_Release(&view);
    for (int i = 0; i < record.held_count; i++) {
        if (status != OK) /* no rows of a record taken back */
            columns_rollback(record.held[i], record.held[i]->record, record.rows[i]);
        Py_DECREF(record.held[i]);
    }
    if (status == ERROR)
        return NULL;
    if (status != OK)
        Py_RETURN_NONE;
    return PyLong_FromSsize_t(record.spans);
}

static PyObject *configure(Decoder *st, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError,
                        "configure(max_name_chars, max_key_chars, max_value_bytes)");
        return NULL;
    }
    Py_ssize_t limits[3];
    for (int i = 0; i < 3; i++) {
        limits[i] = PyLong_AsSsize_t(args[i]);
        if (limits[i] == -1 && PyErr_Occurred())
            return NULL;
    }
    st->cfg.max_name_chars = limits[0];
    st->cfg.max_key_chars = limits[1];
    st->cfg.max_value_bytes = limits[2];
    st->cfg.ready = 1;
    Py_RETURN_NONE;
}

static PyMethodDef decoder_methods[] = {
    {"configure", (PyCFunction)(void (*)(void))configure, METH_FASTCALL,
     "configure(max_name_chars, max_key_chars, max_value_bytes): the span record's limits "
     "on names, attribute keys and attribute values; beyond them, the authority decides."},
    {"configure_rows", (PyCFunction)(void (*)(void))configure_rows, METH_FASTCALL,
     "configure_rows(columns, promoted, resource_promoted, keys, reward_event, kinds): the "
     "store schema's columns, each column's kind and the promoted attributes, for "
     "append_record()."},
    {"columns", (PyCFunction)new_columns, METH_NOARGS,
     "columns() -> Columns: an empty table's columns as Arrow buffers, for append_record()."},
    {"append_record", (PyCFunction)(void (*)(void))append_record, METH_FASTCALL,
     "append_record(hours, payload, gates, digits, fallback_keys, verdicts, topic, "
     "partition, offset, timestamp_ms) -> int | None: an OTLP trace export's spans, each a "
     "row of hours[hour] (new columns() added where missing); the spans appended, or None, "
     "every column as it was, where the authority must decide, as it must for a span or "
     "resource attribute key that verdicts (key -> kept by the attribute lists; None: all "
     "are kept) does not hold. A record's rows are noted in Columns.steps where a text "
     "holds a gate (literal, table of the bytes that may follow it, how many must) or a "
     "run of `digits` decimal digits (gates None: no scan; digits below 0: every record, "
     "as found), a span attribute key is one of fallback_keys, an event is an evaluation, "
     "or verdicts[key] is False."},
    {NULL, NULL, 0, NULL},
};

static PyObject *decoder_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    if (PyTuple_GET_SIZE(args) != 0 || (kwargs != NULL && PyDict_GET_SIZE(kwargs) != 0)) {
        PyErr_SetString(PyExc_TypeError,
                        "Decoder() takes no arguments: configure() and configure_rows() it");
        return NULL;
    }
    Decoder *st = (Decoder *)type->tp_alloc(type, 0); /* zeroed */
    if (st == NULL)
        return NULL;
    st->fused.generation = 1;
    return (PyObject *)st;
}

static void decoder_dealloc(Decoder *st)
{
    clear_rows(st);
    for (int i = 0; i < KEY_SLOTS; i++)
        Py_XDECREF(st->key_cache[i].key);
    Py_XDECREF(st->gates);
    Py_TYPE(st)->tp_free((PyObject *)st);
}

static PyTypeObject DecoderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "spanmill._native.Decoder",
    .tp_basicsize = sizeof(Decoder),
    .tp_dealloc = (destructor)decoder_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The collector's native decoder and row builder: its settings (configure(), "
              "configure_rows()), its key cache and its Columns belong to it alone.",
    .tp_methods = decoder_methods,
    .tp_new = decoder_new,
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_native", "The collector's hot paths, natively.", -1, NULL,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void)
{
    static const char *kinds[6] = {"internal", "internal", "server",
                                   "client",   "producer", "consumer"};
    static const char *statuses[3] = {"unset", "ok", "error"};
    for (int i = 0; i < 6; i++)
        if (KIND_NAMES[i] == NULL && (KIND_NAMES[i] = PyUnicode_InternFromString(kinds[i])) == NULL)
            return NULL;
    for (int i = 0; i < 3; i++)
        if (STATUS_NAMES[i] == NULL
            && (STATUS_NAMES[i] = PyUnicode_InternFromString(statuses[i])) == NULL)
            return NULL;
    if (PyType_Ready(&ColumnsType) < 0 || PyType_Ready(&DecoderType) < 0
        || PyType_Ready(&BufferType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL)
        return NULL;
    if (PyModule_AddType(module, &DecoderType) < 0 || PyModule_AddType(module, &ColumnsType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
