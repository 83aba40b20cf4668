/*
 * The node lab's pod sandbox ("pause") program: holds a pod's namespaces and does nothing
 * else. As PID 1 of the sandbox it reaps children that are re-parented to it, and it exits
 * on SIGINT or SIGTERM. Built static by tests/nodelab/image.sh (nothing can be pulled).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int signal) {
    (void)signal;
    _exit(0);
}

static void reap(int signal) {
    (void)signal;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction on_stop = {.sa_handler = stop};
    struct sigaction on_child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
    if (sigaction(SIGINT, &on_stop, NULL) < 0 || sigaction(SIGTERM, &on_stop, NULL) < 0 ||
        sigaction(SIGCHLD, &on_child, NULL) < 0) {
        perror("sigaction");
        return 1;
    }
    if (getpid() != 1) {
        fprintf(stderr, "pause: not running as PID 1; it only holds a pod's namespaces\n");
    }
    for (;;) {
        pause();
    }
}
