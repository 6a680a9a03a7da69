/* Two threads pinned to one core hand a turn back and forth with sched_yield, N times:
 * the cost of one hand-off between threads that share a core, with no work between
 * (the floor under abe's io thread -> engine -> worker cycle on 2 cores). Built and run by
 * tools/bench/yield_handoff.sh. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static atomic_long turn = 0;
static long n = 1000000;
static int core = 0;

static void *player(void *arg) {
    long me = (long)arg;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(core, &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);
    for (;;) {
        long t = atomic_load(&turn);
        if (t >= n) break;
        if ((t & 1) == me) atomic_store(&turn, t + 1);
        else sched_yield();
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1) n = atol(argv[1]);
    if (argc > 2) core = atoi(argv[2]);
    pthread_t a, b;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pthread_create(&a, 0, player, (void *)0);
    pthread_create(&b, 0, player, (void *)1);
    pthread_join(a, 0);
    pthread_join(b, 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
    printf("%.3f us per hand-off (%ld hand-offs on core %d)\n", s / n * 1e6, n, core);
    return 0;
}
