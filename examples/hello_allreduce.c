/* hello_allreduce.c - the README's example: average a gradient across ranks.
 *   cc hello_allreduce.c $(pkg-config --cflags --libs chorus) -o hello
 *   chorus-run -n 4 -- ./hello */
#include <chorus.h>
#include <stdio.h>

int main(void) {
  chorus_comm_t *comm;
  float grad[1024];
  int rank, size;

  if (chorus_comm_init_from_env(&comm) != CHORUS_SUCCESS) {
    fprintf(stderr, "init: %s\n", chorus_last_error());
    return 1;
  }
  chorus_comm_rank(comm, &rank);
  chorus_comm_size(comm, &size);
  for (int i = 0; i < 1024; i++)
    grad[i] = (float)rank;

  chorus_request_t *req;
  chorus_result rc = chorus_iallreduce(comm, grad, grad, 1024, CHORUS_FLOAT32, CHORUS_AVG, &req);
  if (rc == CHORUS_SUCCESS)
    rc = chorus_wait(&req);
  if (rc != CHORUS_SUCCESS) {
    fprintf(stderr, "allreduce: %s: %s\n", chorus_strerror(rc), chorus_comm_last_error(comm));
  } else {
    printf("rank %d of %d: average %.2f over %s (want %.2f)\n", rank, size, grad[0],
           chorus_comm_provider(comm), (size - 1) / 2.0);
    if (grad[0] != (float)(size - 1) / 2.0f)
      rc = CHORUS_ERR_INTERNAL;
  }
  chorus_comm_destroy(comm);
  return rc != CHORUS_SUCCESS;
}
