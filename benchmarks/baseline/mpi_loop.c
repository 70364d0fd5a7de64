/* mpi_loop: a minimal MPI timing loop in C, the floor that `commprof bench --backend mpi` is compared
 * with (benchmarks/vs_c.py). Float32 sum, one JSON line per (collective, size, mode) on rank 0.
 *
 * Build with the mpicc of the MPI commprof uses (the mpich wheel's, next to the venv's python), run with
 * its mpiexec:
 *
 *     MPICC=.venv/bin/mpicc benchmarks/baseline/build_mpi_loop.sh          # -> build/mpi_loop
 *     .venv/bin/mpiexec -n 2 build/mpi_loop -s 8,1K,16M -n 1000 -w 50 --thread single
 *
 * Options: -c COLL[,COLL]  all_reduce, all_gather, reduce_scatter, broadcast (default: all four)
 *          -s SIZE[,SIZE]  bytes, K/M/G suffixes (default 8); -n ITERS (default 20); -w WARMUP (default 5)
 *          --thread single|funneled|serialized|multiple   MPI_Init_thread's level (default single;
 *                          mpi4py asks for multiple, which costs MPICH ~2-3 us per call)
 *          --barrier once|each   once: as commprof (below); each: an MPI_Barrier before every timed call
 *          --no-thp        no huge pages for large buffers
 *
 * What is timed matches commprof.bench.runner.measure() with MpiComm (commprof/comm/mpi_comm.py):
 *   - per collective, size and mode (out-of-place first, then in-place, as bench reports them): fresh
 *     buffers, W untimed warm-up calls, ONE MPI_Barrier, then N calls back to back, each timed on its own
 *     with clock_gettime(CLOCK_MONOTONIC) (what time.perf_counter_ns reads) around just that call; there
 *     is no barrier between timed calls (commprof has none: `--barrier each` adds one for comparison).
 *   - sizes in nccl-tests' convention, rounded down (and dropped at 0 B or when repeated) as bench does:
 *     all_gather and reduce_scatter move a total of size bytes (world_size x per-rank count),
 *     all_reduce and broadcast size bytes per rank.
 *   - all_reduce: MPI_Allreduce(sendbuf | MPI_IN_PLACE, recvbuf).  all_gather: MPI_Allgather, in place
 *     from chunk `rank` of the output.  reduce_scatter: MPI_Reduce_scatter_block; in place it is
 *     MPI_IN_PLACE followed, on ranks > 0, by the copy of the result to chunk `rank` (NCCL's in-place
 *     contract; MpiComm times that copy too).  broadcast: MPI_Bcast from rank 0, in place only (MPI has
 *     no out-of-place broadcast, and neither does commprof's MPI backend).
 *   - buffers of 2 MiB and more on transparent huge pages (2 MiB-aligned, madvise(MADV_HUGEPAGE)), as
 *     torch allocates them under THP_MEM_ALLOC_ENABLE=1, which `commprof bench --nproc` sets.
 *   - reduced over ranks like bench's default `-a avg`: time_us = mean over ranks of each rank's mean;
 *     median_us = mean over ranks of each rank's median; per-rank values in "per_rank".
 */
#define _GNU_SOURCE
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define THP_BYTES (2u << 20)
#define MAX_SIZES 64

enum { ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, BROADCAST, NCOLL };
static const char *NAMES[NCOLL] = {"all_reduce", "all_gather", "reduce_scatter", "broadcast"};
static const int SPLIT[NCOLL] = {0, 1, 1, 0};       /* size = world_size x per-rank count */
static const int OUT_OF_PLACE[NCOLL] = {1, 1, 1, 0}; /* MPI has no out-of-place broadcast */
static const char *LEVELS[] = {"single", "funneled", "serialized", "multiple"};
static const int LEVEL_VALUES[] = {MPI_THREAD_SINGLE, MPI_THREAD_FUNNELED, MPI_THREAD_SERIALIZED,
                                   MPI_THREAD_MULTIPLE};

static int rank, nranks, thp = 1, barrier_each = 0;

static void die(const char *what, const char *arg) {
    int initialized;
    if (rank == 0) /* before MPI_Init every rank is "rank 0": each says it */
        fprintf(stderr, "mpi_loop: %s%s\n", what, arg ? arg : "");
    MPI_Initialized(&initialized);
    if (initialized)
        MPI_Abort(MPI_COMM_WORLD, 2);
    exit(2);
}

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static long parse_bytes(const char *s) {
    char *end;
    long v = strtol(s, &end, 10);
    switch (*end) {
    case 'K': case 'k': v <<= 10; end++; break;
    case 'M': case 'm': v <<= 20; end++; break;
    case 'G': case 'g': v <<= 30; end++; break;
    }
    if (end == s || (*end && *end != ',') || v < 0)
        die("bad size: ", s);
    return v;
}

static int level_of(const char *s) {
    for (int i = 0; i < 4; i++)
        if (!strcmp(s, LEVELS[i]))
            return i;
    die("--thread takes single, funneled, serialized or multiple, not ", s);
    return 0;
}

/* Zeroed float buffer; huge pages from THP_BYTES on, like torch's allocator with THP enabled. */
static float *alloc(size_t count) {
    size_t bytes = count * sizeof(float);
    void *p = NULL;
    if (thp && bytes >= THP_BYTES) {
        bytes = (bytes + THP_BYTES - 1) / THP_BYTES * THP_BYTES;
        if (posix_memalign(&p, THP_BYTES, bytes))
            die("out of memory", NULL);
        madvise(p, bytes, MADV_HUGEPAGE);
    } else if (!(p = malloc(bytes ? bytes : 1))) {
        die("out of memory", NULL);
    }
    memset(p, 0, bytes);
    return p;
}

/* One call of collective c on `count` elements (the reported size) in the given mode. */
static void run(int c, int inplace, float *a, float *b, int count) {
    int chunk = count / nranks;
    switch (c) {
    case ALL_REDUCE: /* a: input (and result in place), b: output */
        MPI_Allreduce(inplace ? MPI_IN_PLACE : a, inplace ? a : b, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
    case ALL_GATHER: /* a: output of count; b: input of chunk (in place: chunk `rank` of a) */
        if (inplace)
            MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, a, chunk, MPI_FLOAT, MPI_COMM_WORLD);
        else
            MPI_Allgather(b, chunk, MPI_FLOAT, a, chunk, MPI_FLOAT, MPI_COMM_WORLD);
        break;
    case REDUCE_SCATTER: /* a: input of count; b: output of chunk (in place: chunk `rank` of a) */
        if (inplace) {
            MPI_Reduce_scatter_block(MPI_IN_PLACE, a, chunk, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            if (rank)
                memcpy(a + (size_t)rank * chunk, a, (size_t)chunk * sizeof(float));
        } else {
            MPI_Reduce_scatter_block(a, b, chunk, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        }
        break;
    case BROADCAST:
        MPI_Bcast(a, count, MPI_FLOAT, 0, MPI_COMM_WORLD);
        break;
    }
}

static int by_value(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

static double median(double *v, int n) {
    qsort(v, n, sizeof *v, by_value);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void measure(int c, int inplace, long requested, int count, int iters, int warmup, int level,
                    int provided) {
    int second = SPLIT[c] ? count / nranks : count; /* elements of b */
    float *a = alloc(count), *b = inplace ? NULL : alloc(second);
    double *t = malloc(sizeof(double) * (iters ? iters : 1)), mine[2] = {0, 0}, *all = NULL;
    for (int i = 0; i < warmup; i++)
        run(c, inplace, a, b, count);
    MPI_Barrier(MPI_COMM_WORLD);
    for (int i = 0; i < iters; i++) {
        if (barrier_each)
            MPI_Barrier(MPI_COMM_WORLD);
        double t0 = now_ns();
        run(c, inplace, a, b, count);
        t[i] = now_ns() - t0;
    }
    for (int i = 0; i < iters; i++)
        mine[0] += t[i] / 1e3 / iters;
    mine[1] = iters ? median(t, iters) / 1e3 : 0;
    if (rank == 0)
        all = malloc(sizeof(double) * 2 * nranks);
    MPI_Gather(mine, 2, MPI_DOUBLE, all, 2, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        double mean = 0, med = 0;
        for (int r = 0; r < nranks; r++) {
            mean += all[2 * r] / nranks;
            med += all[2 * r + 1] / nranks;
        }
        printf("{\"collective\": \"%s\", \"nbytes\": %ld, \"requested_nbytes\": %ld, \"count\": %d, "
               "\"inplace\": %s, \"world_size\": %d, \"iters\": %d, \"warmup\": %d, \"thread\": \"%s\", "
               "\"thread_provided\": \"%s\", \"barrier\": \"%s\", \"time_us\": %.4f, \"median_us\": %.4f, "
               "\"per_rank\": [",
               NAMES[c], (long)count * (long)sizeof(float), requested, count, inplace ? "true" : "false",
               nranks, iters, warmup, LEVELS[level], LEVELS[provided], barrier_each ? "each" : "once", mean,
               med);
        for (int r = 0; r < nranks; r++)
            printf("%s{\"rank\": %d, \"mean_us\": %.4f, \"median_us\": %.4f}", r ? ", " : "", r, all[2 * r],
                   all[2 * r + 1]);
        printf("]}\n");
        fflush(stdout);
        free(all);
    }
    free(t);
    free(a);
    free(b);
}

int main(int argc, char **argv) {
    int level = 0, provided_value, provided = 0, iters = 20, warmup = 5, nsizes = 0, want[NCOLL] = {1, 1, 1, 1};
    long sizes[MAX_SIZES];
    for (int i = 1; i < argc; i++) /* the thread level first: MPI is not initialised yet */
        if (!strcmp(argv[i], "--thread") && i + 1 < argc)
            level = level_of(argv[++i]);
    MPI_Init_thread(&argc, &argv, LEVEL_VALUES[level], &provided_value);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    for (int i = 0; i < 4; i++)
        if (LEVEL_VALUES[i] == provided_value)
            provided = i;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(arg, "--no-thp")) {
            thp = 0;
        } else if (!val) {
            die("unknown option or missing value: ", arg);
        } else if (!strcmp(arg, "--thread")) {
            i++;
        } else if (!strcmp(arg, "-n")) {
            iters = atoi(argv[++i]);
        } else if (!strcmp(arg, "-w")) {
            warmup = atoi(argv[++i]);
        } else if (!strcmp(arg, "--barrier")) {
            if (strcmp(val, "once") && strcmp(val, "each"))
                die("--barrier takes once or each, not ", val);
            barrier_each = !strcmp(argv[++i], "each");
        } else if (!strcmp(arg, "-s")) {
            for (const char *p = argv[++i]; p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL) {
                if (nsizes == MAX_SIZES)
                    die("too many sizes", NULL);
                sizes[nsizes++] = parse_bytes(p);
            }
        } else if (!strcmp(arg, "-c")) {
            memset(want, 0, sizeof want);
            for (char *tok = strtok(argv[++i], ","); tok; tok = strtok(NULL, ",")) {
                int c = 0;
                while (c < NCOLL && strcmp(tok, NAMES[c]))
                    c++;
                if (c == NCOLL)
                    die("unknown collective: ", tok);
                want[c] = 1;
            }
        } else {
            die("unknown option: ", arg);
        }
    }
    if (iters < 1 || warmup < 0)
        die("-n must be at least 1 and -w at least 0", NULL);
    if (!nsizes)
        sizes[nsizes++] = 8;
    for (int c = 0; c < NCOLL; c++) {
        if (!want[c])
            continue;
        long unit = (long)sizeof(float) * (SPLIT[c] ? nranks : 1), seen[MAX_SIZES];
        for (int s = 0; s < nsizes; s++) {
            long count = sizes[s] / unit * (unit / (long)sizeof(float));
            int repeat = 0;
            for (int k = 0; k < s; k++)
                repeat |= seen[k] == count;
            seen[s] = count;
            if (count == 0 || repeat || count > 0x7fffffff)
                continue; /* bench drops sizes that round to 0 B or repeat; MPI counts are ints */
            for (int inplace = !OUT_OF_PLACE[c]; inplace <= 1; inplace++)
                measure(c, inplace, sizes[s], (int)count, iters, warmup, level, provided);
        }
    }
    MPI_Finalize();
    return 0;
}
