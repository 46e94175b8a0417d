/*
 * launch.h - `slicetrain launch`: start a worker group on this machine.
 *
 *   slicetrain launch --num-slices S --devices-per-slice D [--threads-per-device T]
 *                     [--port P] -- CONFIG.yml key=value ...
 *
 * Starts S x D worker processes (`slicetrain train CONFIG ...`), each with
 * the SLICETRAIN_* variables giving its place (docs/distributed.md), streams
 * rank 0's output as is and other ranks' lines prefixed "[rank N] ", and
 * exits with the first failing rank's status after stopping the others
 * (SIGTERM, then SIGKILL after a grace period); a rank killed by a signal
 * is a peer failure, status 3. Workers die with the launcher
 * (PR_SET_PDEATHSIG): no orphans.
 */
#ifndef ST_CLI_LAUNCH_H
#define ST_CLI_LAUNCH_H

int st_cmd_launch(int argc, char **argv);

#endif
