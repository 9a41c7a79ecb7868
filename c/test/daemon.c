/*
 * daemon.c - start and stop tensorcastd for the C tests (see daemon.h).
 */
#include "daemon.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

void tcd_print_log(const tcd *d)
{
    FILE *f = fopen(d->log, "r");
    if (!f)
        return;
    fprintf(stderr, "--- %s ---\n", d->log);
    char line[1024];
    while (fgets(line, sizeof line, f))
        fputs(line, stderr);
    fclose(f);
}

/* wait_exit waits up to ms for the daemon to exit (a pidfd: no polling)
 * and returns its wait status, or -1 when it is still running. */
static int wait_exit(tcd *d, int ms)
{
    int pfd = (int)syscall(SYS_pidfd_open, d->pid, 0);
    if (pfd >= 0) {
        struct pollfd p = {.fd = pfd, .events = POLLIN, .revents = 0};
        while (poll(&p, 1, ms) < 0 && errno == EINTR)
            ;
        close(pfd);
    }
    int st = 0;
    pid_t r;
    while ((r = waitpid(d->pid, &st, pfd >= 0 ? WNOHANG : 0)) < 0 && errno == EINTR)
        ;
    if (r == d->pid) {
        d->pid = 0;
        return st;
    }
    return -1;
}

int tcd_start(tcd *d, const char *bin, const char *const *extra)
{
    memset(d, 0, sizeof *d);
    snprintf(d->dir, sizeof d->dir, "/tmp/tc-ctest-XXXXXX");
    if (!mkdtemp(d->dir)) {
        perror("mkdtemp");
        return -1;
    }
    snprintf(d->socket, sizeof d->socket, "%s/s.sock", d->dir);
    snprintf(d->data, sizeof d->data, "%s/data", d->dir);
    snprintf(d->log, sizeof d->log, "%s/daemon.log", d->dir);
    char notify[80];
    snprintf(notify, sizeof notify, "%s/notify.sock", d->dir);

    int ns = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", notify);
    if (ns < 0 || bind(ns, (struct sockaddr *)&sa, sizeof sa) < 0) {
        perror("notify socket");
        return -1;
    }

    const char *argv[64];
    int n = 0;
    argv[n++] = bin;
    argv[n++] = "--socket";
    argv[n++] = d->socket;
    argv[n++] = "--data-dir";
    argv[n++] = d->data;
    argv[n++] = "--pool-size";
    argv[n++] = "32MiB";
    argv[n++] = "--hugepages";
    argv[n++] = "off";
    /* Several daemons run on one host (and other tests' too): none takes
     * the default metrics port. */
    argv[n++] = "--metrics-address";
    argv[n++] = "off";
    for (int i = 0; extra && extra[i] && n < 63; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;

    /* The child's environment, made before fork: only async-signal-safe
     * calls run between fork and exec. */
    extern char **environ;
    char notify_env[128];
    snprintf(notify_env, sizeof notify_env, "NOTIFY_SOCKET=%s", notify);
    size_t ne = 0;
    while (environ[ne])
        ne++;
    char **envp = calloc(ne + 2, sizeof *envp);
    if (!envp) {
        close(ns);
        return -1;
    }
    size_t k = 0;
    for (size_t i = 0; i < ne; i++)
        if (strncmp(environ[i], "NOTIFY_SOCKET=", 14) != 0 && strncmp(environ[i], "TENSORCAST_", 11) != 0)
            envp[k++] = environ[i];
    envp[k++] = notify_env;
    envp[k] = NULL;

    fflush(NULL);
    d->pid = fork();
    if (d->pid < 0) {
        perror("fork");
        free(envp);
        close(ns);
        return -1;
    }
    if (d->pid == 0) {
        int lf = open(d->log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (lf >= 0) {
            dup2(lf, 1);
            dup2(lf, 2);
        }
        execve(bin, (char *const *)argv, envp);
        _exit(127);
    }
    free(envp);

    int pfd = (int)syscall(SYS_pidfd_open, d->pid, 0);
    int64_t deadline = now_ms() + 20000;
    int ready = 0;
    while (!ready) {
        int64_t left = deadline - now_ms();
        if (left <= 0)
            break;
        struct pollfd p[2] = {{.fd = ns, .events = POLLIN, .revents = 0}, {.fd = pfd, .events = POLLIN, .revents = 0}};
        int r = poll(p, pfd >= 0 ? 2 : 1, (int)left);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0 || (p[1].revents & POLLIN))
            break; /* timed out, or the daemon exited */
        char msg[512];
        ssize_t m = recv(ns, msg, sizeof msg - 1, 0);
        if (m > 0) {
            msg[m] = 0;
            ready = strstr(msg, "READY=1") != NULL;
        }
    }
    if (pfd >= 0)
        close(pfd);
    close(ns);
    if (!ready) {
        fprintf(stderr, "tensorcastd (%s) did not become ready\n", bin);
        tcd_print_log(d);
        tcd_stop(d);
        return -1;
    }
    return 0;
}

void tcd_freeze(tcd *d)
{
    if (d->pid <= 0)
        return;
    kill(d->pid, SIGSTOP);
    siginfo_t si;
    while (waitid(P_PID, (id_t)d->pid, &si, WSTOPPED) < 0 && errno == EINTR)
        ;
}

void tcd_thaw(tcd *d)
{
    if (d->pid <= 0)
        return;
    kill(d->pid, SIGCONT);
    siginfo_t si;
    while (waitid(P_PID, (id_t)d->pid, &si, WCONTINUED) < 0 && errno == EINTR)
        ;
}

void tcd_kill(tcd *d)
{
    if (d->pid <= 0)
        return;
    kill(d->pid, SIGKILL);
    wait_exit(d, -1);
}

int tcd_stop(tcd *d)
{
    int st = 0;
    if (d->pid > 0) {
        kill(d->pid, SIGCONT);
        kill(d->pid, SIGTERM);
        st = wait_exit(d, 20000);
        if (st < 0) {
            fprintf(stderr, "tensorcastd did not stop within 20 s of SIGTERM; killing it\n");
            tcd_kill(d);
            st = -1;
        }
    }
    if (d->dir[0])
        nftw(d->dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    d->dir[0] = 0;
    return st;
}
