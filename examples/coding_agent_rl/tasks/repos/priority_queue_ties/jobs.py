import heapq


class JobQueue:
    """Lowest priority number first; equal priorities in insertion order."""

    def __init__(self):
        self._heap = []

    def push(self, priority, job):
        heapq.heappush(self._heap, (priority, job))

    def pop(self):
        return heapq.heappop(self._heap)[-1]

    def __len__(self):
        return len(self._heap)
