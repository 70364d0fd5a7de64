/*
 * nvtx_recorder.c - a tiny NVTX injection library that records NVTX events
 * to text files, so tests can check NVTX emission without Nsight.
 *
 * NVTX (v3, header-only) looks at env NVTX_INJECTION64_PATH on the first NVTX
 * call, dlopen()s that library and calls its InitializeInjectionNvtx2() with
 * the export-table getter -- the same mechanism Nsight Systems uses.  We fetch
 * the CORE and CORE2 function tables and write our handlers into their slots.
 *
 * Build (tests/support/nvtx_recorder.py's build() does this for you):
 *   gcc -shared -fPIC -O2 -I<dir containing nvtx3/> -o libnvtx_recorder.so \
 *       tests/support/nvtx_recorder.c -lpthread
 * Use:
 *   NVTX_INJECTION64_PATH=/abs/libnvtx_recorder.so \
 *   COMMPROF_NVTX_RECORD=/tmp/rec  python my_script.py
 * Each process appends to "/tmp/rec.<pid>", one line per event, 9 fields
 * separated by TAB (tabs/newlines inside strings are replaced by spaces):
 *   kind  domain  category  message  n  tid  ts_ns  color  payload
 *   kind     push | pop | mark | start | end
 *   domain   domain name, "" for the default (NULL) domain
 *   category name given via nvtx[Domain]NameCategory, "" if category 0,
 *            the decimal id if no name is known
 *   message  ASCII/registered/wide text ("" for pop/end or no message)
 *   n        push: 0-based nesting depth of the new range (per thread+domain);
 *            pop: depth of the closed range, -1 for an unbalanced pop;
 *            mark: current depth; start/end: the process-range id
 *   tid      Linux thread id
 *   ts_ns    CLOCK_MONOTONIC in ns when the call arrived (Python's
 *            time.perf_counter_ns() on Linux reads the same clock)
 *   color    ARGB as 8 hex digits, "" if the event has none
 *   payload  the event's numeric payload (integer or float), "" if none
 * Lines are written with one write(2) each on an O_APPEND fd, so nothing is
 * lost on os._exit() or crashes after the call returns.  If
 * COMMPROF_NVTX_RECORD is unset the tool declines to attach (NVTX no-ops).
 */
#define _GNU_SOURCE
#define NVTX_NO_IMPL
#include <nvtx3/nvToolsExt.h>

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <wchar.h>

#define MAX_DOMAINS 256
#define LINE_MAX_LEN 4096

typedef struct Domain { char *name; int index; } Domain;
typedef struct Category { int dom; uint32_t id; char *name; struct Category *next; } Category;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static const char *g_prefix;
static int g_fd = -1;
static pid_t g_fd_pid;
static Domain *g_domains[MAX_DOMAINS];     /* index 0 = default domain */
static int g_ndomains = 1;
static Category *g_categories;
static uint64_t g_next_range_id = 1;
static __thread int t_depth[MAX_DOMAINS];  /* push/pop nesting per thread+domain */

static int dom_index(nvtxDomainHandle_t d) { return d ? ((Domain *)d)->index : 0; }
static const char *dom_name(int i) { return i ? g_domains[i]->name : ""; }

static char *wide_to_ascii(const wchar_t *w)
{
    size_t n = w ? wcslen(w) : 0;
    char *s = malloc(n + 1);
    for (size_t i = 0; i < n; i++) s[i] = (w[i] > 0 && w[i] < 128) ? (char)w[i] : '?';
    s[n] = '\0';
    return s;
}

/* Append src to buf[*len], replacing TAB/CR/LF with spaces. */
static void put(char *buf, size_t *len, const char *src)
{
    for (; src && *src && *len < LINE_MAX_LEN - 64; src++)
        buf[(*len)++] = (*src == '\t' || *src == '\n' || *src == '\r') ? ' ' : *src;
}

static const char *category_name(int dom, uint32_t id, char *tmp, size_t tmplen)
{   /* caller holds g_lock */
    if (id == 0) return "";
    for (Category *c = g_categories; c; c = c->next)
        if (c->dom == dom && c->id == id) return c->name;
    snprintf(tmp, tmplen, "%u", id);
    return tmp;
}

static void emit(const char *kind, int dom, const nvtxEventAttributes_t *a, const char *msg, long long n)
{
    char line[LINE_MAX_LEN], tmp[16];
    size_t len = 0;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    uint32_t cat = a ? a->category : 0;
    pthread_mutex_lock(&g_lock);
    pid_t pid = getpid();
    if (g_fd < 0 || g_fd_pid != pid) {  /* first event, or we are a fork()ed child */
        char path[4096];
        if (g_fd >= 0) close(g_fd);
        snprintf(path, sizeof path, "%s.%d", g_prefix, (int)pid);
        g_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        g_fd_pid = pid;
    }
    put(line, &len, kind);       line[len++] = '\t';
    put(line, &len, dom_name(dom)); line[len++] = '\t';
    put(line, &len, category_name(dom, cat, tmp, sizeof tmp)); line[len++] = '\t';
    put(line, &len, msg);
    len += snprintf(line + len, sizeof line - len, "\t%lld\t%ld\t%lld\t", n, (long)syscall(SYS_gettid),
                    (long long)now.tv_sec * 1000000000LL + now.tv_nsec);
    if (a && a->colorType == NVTX_COLOR_ARGB)
        len += snprintf(line + len, sizeof line - len, "%08x", a->color);
    line[len++] = '\t';
    if (a) switch (a->payloadType) {
    case NVTX_PAYLOAD_TYPE_UNSIGNED_INT64:
        len += snprintf(line + len, sizeof line - len, "%llu", (unsigned long long)a->payload.ullValue); break;
    case NVTX_PAYLOAD_TYPE_INT64:
        len += snprintf(line + len, sizeof line - len, "%lld", (long long)a->payload.llValue); break;
    case NVTX_PAYLOAD_TYPE_UNSIGNED_INT32:
        len += snprintf(line + len, sizeof line - len, "%u", a->payload.uiValue); break;
    case NVTX_PAYLOAD_TYPE_INT32:
        len += snprintf(line + len, sizeof line - len, "%d", a->payload.iValue); break;
    case NVTX_PAYLOAD_TYPE_DOUBLE:
        len += snprintf(line + len, sizeof line - len, "%.17g", a->payload.dValue); break;
    case NVTX_PAYLOAD_TYPE_FLOAT:
        len += snprintf(line + len, sizeof line - len, "%.9g", (double)a->payload.fValue); break;
    default: break;
    }
    line[len++] = '\n';
    if (g_fd >= 0 && write(g_fd, line, len) < 0) { /* nothing sensible to do */ }
    pthread_mutex_unlock(&g_lock);
}

/* Message text of an event; *owned is set if the result must be freed. */
static const char *event_message(const nvtxEventAttributes_t *a, char **owned)
{
    *owned = NULL;
    if (!a) return "";
    switch (a->messageType) {
    case NVTX_MESSAGE_TYPE_ASCII: return a->message.ascii ? a->message.ascii : "";
    case NVTX_MESSAGE_TYPE_REGISTERED:  /* our handles are the registered char* */
        return a->message.registered ? (const char *)a->message.registered : "";
    case NVTX_MESSAGE_TYPE_UNICODE: return *owned = wide_to_ascii(a->message.unicode);
    default: return "";
    }
}

static int push_ex(int dom, const nvtxEventAttributes_t *a)
{
    char *owned;
    const char *msg = event_message(a, &owned);
    int depth = t_depth[dom]++;
    emit("push", dom, a, msg, depth);
    free(owned);
    return depth;
}

static int pop(int dom)
{
    int depth = t_depth[dom] > 0 ? --t_depth[dom] : -1;
    emit("pop", dom, NULL, "", depth);
    return depth;
}

static void mark_ex(int dom, const nvtxEventAttributes_t *a)
{
    char *owned;
    const char *msg = event_message(a, &owned);
    emit("mark", dom, a, msg, t_depth[dom]);
    free(owned);
}

static nvtxRangeId_t start_ex(int dom, const nvtxEventAttributes_t *a)
{
    char *owned;
    const char *msg = event_message(a, &owned);
    nvtxRangeId_t id = __atomic_fetch_add(&g_next_range_id, 1, __ATOMIC_RELAXED);
    emit("start", dom, a, msg, (long long)id);
    free(owned);
    return id;
}

static void name_category(int dom, uint32_t id, const char *name)
{
    pthread_mutex_lock(&g_lock);
    Category *c = g_categories;
    while (c && !(c->dom == dom && c->id == id)) c = c->next;
    if (!c) {
        c = calloc(1, sizeof *c);
        c->dom = dom; c->id = id; c->next = g_categories; g_categories = c;
    } else free(c->name);
    c->name = strdup(name ? name : "");
    pthread_mutex_unlock(&g_lock);
}

static nvtxDomainHandle_t domain_create(const char *name)
{   /* one handle per distinct name, never freed (handles must stay valid) */
    Domain *d = NULL;
    pthread_mutex_lock(&g_lock);
    for (int i = 1; i < g_ndomains && !d; i++)
        if (strcmp(g_domains[i]->name, name ? name : "") == 0) d = g_domains[i];
    if (!d && g_ndomains < MAX_DOMAINS) {
        d = calloc(1, sizeof *d);
        d->name = strdup(name ? name : "");
        d->index = g_ndomains;
        g_domains[g_ndomains++] = d;
    }
    pthread_mutex_unlock(&g_lock);
    return (nvtxDomainHandle_t)d;  /* NULL (= default domain) if table full */
}

/* ---- NVTX entry points (CORE module: default domain) ---- */
static nvtxEventAttributes_t text_attr(int type, const void *m)
{
    nvtxEventAttributes_t a = {0};
    a.messageType = type;
    if (type == NVTX_MESSAGE_TYPE_ASCII) a.message.ascii = m; else a.message.unicode = m;
    return a;
}
static int NVTX_API h_RangePushEx(const nvtxEventAttributes_t *a) { return push_ex(0, a); }
static int NVTX_API h_RangePushA(const char *m)
{ nvtxEventAttributes_t a = text_attr(NVTX_MESSAGE_TYPE_ASCII, m); return push_ex(0, &a); }
static int NVTX_API h_RangePushW(const wchar_t *m)
{ nvtxEventAttributes_t a = text_attr(NVTX_MESSAGE_TYPE_UNICODE, m); return push_ex(0, &a); }
static int NVTX_API h_RangePop(void) { return pop(0); }
static void NVTX_API h_MarkEx(const nvtxEventAttributes_t *a) { mark_ex(0, a); }
static void NVTX_API h_MarkA(const char *m)
{ nvtxEventAttributes_t a = text_attr(NVTX_MESSAGE_TYPE_ASCII, m); mark_ex(0, &a); }
static nvtxRangeId_t NVTX_API h_RangeStartEx(const nvtxEventAttributes_t *a) { return start_ex(0, a); }
static void NVTX_API h_RangeEnd(nvtxRangeId_t id) { emit("end", 0, NULL, "", (long long)id); }
static void NVTX_API h_NameCategoryA(uint32_t id, const char *n) { name_category(0, id, n); }
static void NVTX_API h_NameCategoryW(uint32_t id, const wchar_t *n)
{ char *s = wide_to_ascii(n); name_category(0, id, s); free(s); }

/* ---- CORE2 module: domain API (what the `nvtx` Python package uses) ---- */
static int NVTX_API h_DomainRangePushEx(nvtxDomainHandle_t d, const nvtxEventAttributes_t *a)
{ return push_ex(dom_index(d), a); }
static int NVTX_API h_DomainRangePop(nvtxDomainHandle_t d) { return pop(dom_index(d)); }
static void NVTX_API h_DomainMarkEx(nvtxDomainHandle_t d, const nvtxEventAttributes_t *a)
{ mark_ex(dom_index(d), a); }
static nvtxRangeId_t NVTX_API h_DomainRangeStartEx(nvtxDomainHandle_t d, const nvtxEventAttributes_t *a)
{ return start_ex(dom_index(d), a); }
static void NVTX_API h_DomainRangeEnd(nvtxDomainHandle_t d, nvtxRangeId_t id)
{ emit("end", dom_index(d), NULL, "", (long long)id); }
static void NVTX_API h_DomainNameCategoryA(nvtxDomainHandle_t d, uint32_t id, const char *n)
{ name_category(dom_index(d), id, n); }
static void NVTX_API h_DomainNameCategoryW(nvtxDomainHandle_t d, uint32_t id, const wchar_t *n)
{ char *s = wide_to_ascii(n); name_category(dom_index(d), id, s); free(s); }
static nvtxStringHandle_t NVTX_API h_DomainRegisterStringA(nvtxDomainHandle_t d, const char *s)
{ (void)d; return (nvtxStringHandle_t)strdup(s ? s : ""); }  /* handle == text, leaked */
static nvtxStringHandle_t NVTX_API h_DomainRegisterStringW(nvtxDomainHandle_t d, const wchar_t *s)
{ (void)d; return (nvtxStringHandle_t)wide_to_ascii(s); }
static nvtxDomainHandle_t NVTX_API h_DomainCreateA(const char *n) { return domain_create(n); }
static nvtxDomainHandle_t NVTX_API h_DomainCreateW(const wchar_t *n)
{ char *s = wide_to_ascii(n); nvtxDomainHandle_t d = domain_create(s); free(s); return d; }
static void NVTX_API h_DomainDestroy(nvtxDomainHandle_t d) { (void)d; }

static void set_slot(NvtxFunctionTable t, unsigned size, unsigned id, void *fn)
{
    if (t && id < size && t[id]) *t[id] = (NvtxFunctionPointer)fn;
}

NVTX_DYNAMIC_EXPORT int NVTX_API InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get_table)
{
    const char *prefix = getenv("COMMPROF_NVTX_RECORD");
    if (!prefix || !*prefix || !get_table) return 0;  /* 0 = do not attach */
    g_prefix = strdup(prefix);  /* copy: the environment may change later */
    const NvtxExportTableCallbacks *cb = get_table(NVTX_ETID_CALLBACKS);
    if (!cb || cb->struct_size < sizeof *cb || !cb->GetModuleFunctionTable) return 0;
    const NvtxExportTableVersionInfo *vi = get_table(NVTX_ETID_VERSIONINFO);
    if (vi && vi->struct_size >= sizeof *vi && vi->SetInjectionNvtxVersion)
        vi->SetInjectionNvtxVersion(NVTX_VERSION);

    NvtxFunctionTable t = NULL;
    unsigned n = 0;
    if (!cb->GetModuleFunctionTable(NVTX_CB_MODULE_CORE, &t, &n)) return 0;
    set_slot(t, n, NVTX_CBID_CORE_MarkEx, h_MarkEx);
    set_slot(t, n, NVTX_CBID_CORE_MarkA, h_MarkA);
    set_slot(t, n, NVTX_CBID_CORE_RangeStartEx, h_RangeStartEx);
    set_slot(t, n, NVTX_CBID_CORE_RangeEnd, h_RangeEnd);
    set_slot(t, n, NVTX_CBID_CORE_RangePushEx, h_RangePushEx);
    set_slot(t, n, NVTX_CBID_CORE_RangePushA, h_RangePushA);
    set_slot(t, n, NVTX_CBID_CORE_RangePushW, h_RangePushW);
    set_slot(t, n, NVTX_CBID_CORE_RangePop, h_RangePop);
    set_slot(t, n, NVTX_CBID_CORE_NameCategoryA, h_NameCategoryA);
    set_slot(t, n, NVTX_CBID_CORE_NameCategoryW, h_NameCategoryW);

    if (!cb->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &t, &n)) return 0;
    set_slot(t, n, NVTX_CBID_CORE2_DomainMarkEx, h_DomainMarkEx);
    set_slot(t, n, NVTX_CBID_CORE2_DomainRangeStartEx, h_DomainRangeStartEx);
    set_slot(t, n, NVTX_CBID_CORE2_DomainRangeEnd, h_DomainRangeEnd);
    set_slot(t, n, NVTX_CBID_CORE2_DomainRangePushEx, h_DomainRangePushEx);
    set_slot(t, n, NVTX_CBID_CORE2_DomainRangePop, h_DomainRangePop);
    set_slot(t, n, NVTX_CBID_CORE2_DomainNameCategoryA, h_DomainNameCategoryA);
    set_slot(t, n, NVTX_CBID_CORE2_DomainNameCategoryW, h_DomainNameCategoryW);
    set_slot(t, n, NVTX_CBID_CORE2_DomainRegisterStringA, h_DomainRegisterStringA);
    set_slot(t, n, NVTX_CBID_CORE2_DomainRegisterStringW, h_DomainRegisterStringW);
    set_slot(t, n, NVTX_CBID_CORE2_DomainCreateA, h_DomainCreateA);
    set_slot(t, n, NVTX_CBID_CORE2_DomainCreateW, h_DomainCreateW);
    set_slot(t, n, NVTX_CBID_CORE2_DomainDestroy, h_DomainDestroy);
    return 1;
}
